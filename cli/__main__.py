"""`python -m cli`: the powercut command."""

import sys

from cli.main import main

sys.exit(main())
