"""Prepare an OpenR1-Math-style training set the way the Reinforce-Ada paper does: `python scripts/prepare_data.py`.

A thin entry over `trl_ada.cli.prepare_data`, which holds the code and documents it (`--help`); the installed package runs
the same command, with the same flags, as `trl-ada prepare-data`.
"""

import sys

from trl_ada.cli.prepare_data import *  # noqa: F403  (the functions, for code that loads this script as a module)
from trl_ada.cli.prepare_data import main

if __name__ == "__main__":
    sys.exit(main())
