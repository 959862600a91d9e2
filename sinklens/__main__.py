"""`python -m sinklens ...`: the same command line as `sinklens ...`."""
import sys

from sinklens.cli import main

sys.exit(main())
