"""`python -m flows.cli ...`: the same as the `cascade` console script."""

import sys

from flows.cli import main

sys.exit(main())
