"""`python -m polytile` is the `polytile` command."""

import sys

from polytile.cli import main

if __name__ == "__main__":
    sys.exit(main())
