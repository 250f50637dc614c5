"""Evaluate a checkpoint: Ave@k and pass@k on math datasets, scored by a verifier: `python scripts/evaluate.py`.

A thin entry over `trl_ada.cli.evaluate`, which holds the code and documents it (`--help`); the installed package runs the
same command, with the same flags, as `trl-ada evaluate`.
"""

import sys

from trl_ada.cli.evaluate import *  # noqa: F403  (the functions, for code that loads this script as a module)
from trl_ada.cli.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
