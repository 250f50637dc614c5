"""`python -m trl_ada.cli ...`: the `trl-ada` command."""

import sys

from . import main

sys.exit(main())
