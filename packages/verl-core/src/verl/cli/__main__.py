"""`python -m verl.cli`: the `verl` command."""

import sys

from verl.cli import main

sys.exit(main())
