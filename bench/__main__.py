"""`python -m bench <name> [options]`: see `bench/__init__.py`."""

import sys

from bench import main

sys.exit(main())
