"""Moved: the training job lives in `trl_ada.cli.train`.

Kept for ``accelerate launch -m trl_ada.train ...`` and ``python -m trl_ada.train`` (the documented multi-process form
for an installed package) and for ``from trl_ada.train import ...``: it re-exports the module's public names.
"""

import sys

from .cli.train import *  # noqa: F403 - re-exports
from .cli.train import cli_main

if __name__ == "__main__":
    sys.exit(cli_main())
