"""JSON Schemas of recipe.yaml and capability files, generated from the pydantic models.

Editors use them for completion and inline docs; the committed copies under
schemas/ are kept in sync by tests/recipe/test_schemas.py. Regenerate with

    python -m dabuild.schemas            # write schemas/*.json
    python -m dabuild.schemas --check    # exit 1 if they are out of date
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pydantic import BaseModel

from dabuild.capability import CapabilitySpec
from dabuild.recipe import Recipe
from dabuild.resources import data_dir

DIALECT = "https://json-schema.org/draft/2020-12/schema"

# file name -> (model, title)
SCHEMAS: dict[str, tuple[type[BaseModel], str]] = {
    "recipe.schema.json": (Recipe, "dabuild recipe"),
    "capability.schema.json": (CapabilitySpec, "dabuild capability"),
}


def render(model: type[BaseModel], title: str) -> str:
    """The schema as stable text: sorted keys, two-space indent, trailing newline."""
    schema = model.model_json_schema()
    schema.update({"$schema": DIALECT, "title": title})
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def stale(directory: Path) -> list[Path]:
    """Schema files in `directory` that differ from what the models generate."""
    return [
        directory / name
        for name, (model, title) in SCHEMAS.items()
        if not (directory / name).is_file() or (directory / name).read_text(encoding="utf-8") != render(model, title)
    ]


def write(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, (model, title) in SCHEMAS.items():
        (directory / name).write_text(render(model, title), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dabuild.schemas", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the schema files are out of date")
    parser.add_argument("--dir", type=Path, default=data_dir("schemas"), help="schema folder (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.check:
        outdated = stale(args.dir)
        for path in outdated:
            print(f"{path}: out of date; run `python -m dabuild.schemas`", file=sys.stderr)
        return 1 if outdated else 0
    write(args.dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
