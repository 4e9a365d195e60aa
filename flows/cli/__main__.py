"""`python -m flows.cli`: the `arena` command."""

import sys

from flows.cli import main

sys.exit(main())
