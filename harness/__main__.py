"""`python -m harness`: the powercut command."""

import sys

from harness.commands.cli import main

sys.exit(main())
