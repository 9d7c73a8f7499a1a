"""The installed version of a Python package, as a key or a report records it."""

from __future__ import annotations

import importlib.metadata


def installed_version(package: str) -> str:
    """The distribution's version, or "absent": a missing package is a fact to record, not an error.

    Looked up through the module at each call, so an upgrade within one process (or a test that stands one
    in) is seen."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "absent"
