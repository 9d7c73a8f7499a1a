"""`python -m dabuild` runs the same command as the `dabuild` script."""

import sys

from dabuild.cli import main

sys.exit(main())
