"""Where the bundled capability YAMLs and JSON schemas live.

In a source checkout (or an editable install) they sit beside the package at
the top of the repository; a wheel carries them inside the package under
`_data/` (see `force-include` in pyproject.toml).
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def data_dir(name: str) -> Path:
    """The bundled folder `name` ('capabilities' or 'schemas')."""
    inside = _PACKAGE / "_data" / name
    return inside if inside.is_dir() else _PACKAGE.parent / name
