"""`python3 -m tuner.cli ...`: the same as the `tuner` console script."""

import sys

from . import main

sys.exit(main())
