"""`python -m kvwire.validate`: the entry point `ray job submit` runs (no console script needed)."""
import sys

from kvwire.validate.cli import main

sys.exit(main())
