"""The installed version of a Python package, as a key or a report records it."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version


def installed_version(package: str) -> str:
    """The distribution's version, or "absent": a missing package is a fact to record, not an error."""
    try:
        return version(package)
    except PackageNotFoundError:
        return "absent"
