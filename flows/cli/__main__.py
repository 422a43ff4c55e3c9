"""`python -m cascade.flows.cli ...`: the same as the `cascade` console script."""

import sys

from cascade.flows.cli import main

sys.exit(main())
