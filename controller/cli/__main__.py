"""`python -m controller.cli`: the `vramgate` command."""

import sys

from controller.cli.main import main

sys.exit(main())
