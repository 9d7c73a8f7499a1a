"""`python -m dabuild` runs the same command as the `dabuild` script."""

from dabuild.cli import run

run()
