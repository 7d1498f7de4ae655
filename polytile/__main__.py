"""`python -m polytile` is the `polytile` command."""

import sys

from polytile.cli import main

sys.exit(main())
