"""`python -m faults NAME [--short]`: see `faults/__init__.py`."""

import sys

from faults import main

sys.exit(main())
