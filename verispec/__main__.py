"""`python -m verispec` runs the command line."""

import sys

from verispec.cli import main

sys.exit(main())
