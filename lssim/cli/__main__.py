"""python -m lssim.cli: the ``lssim`` command."""

import sys

from lssim.cli import main

sys.exit(main())
