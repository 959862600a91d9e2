"""`python -m sinklens.cli ...` (what torchrun / accelerate launch run)."""
import sys

from sinklens.cli import main

sys.exit(main())
