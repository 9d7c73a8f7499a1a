"""The committed JSON Schemas match the pydantic models, and say the same about real files."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from dabuild import schemas
from dabuild.resources import data_dir

SCHEMA_DIR = data_dir("schemas")
BUNDLED_CAPABILITIES = sorted(data_dir("capabilities").glob("*.yaml"))

VALID_RECIPE = {
    "name": "digits-mlp",
    "model": {"framework": "numpy", "source": "model.py:build", "weights": "weights.npz", "inputs": {"x": [None, 64]}},
    "data": {
        "calibration": {"source": "data.npz", "x": "x_train", "samples": 256},
        "evaluation": {"source": "data.npz", "x": {"x": "x_test"}, "y": "y_test"},
        "metric": "accuracy",
    },
    "tuning": {"strategy": "basic", "accuracy": {"criterion": "relative", "tolerable_loss": 0.01}, "timeout": 600},
    "targets": [{"name": "mcu", "kind": "c", "options": {"cflags": ["-O3"]}, "check_io": {"tolerance": "exact"}}],
}


def schema(name: str) -> dict:
    return json.loads((SCHEMA_DIR / name).read_text(encoding="utf-8"))


def test_committed_schemas_match_the_models() -> None:
    assert schemas.stale(SCHEMA_DIR) == [], "run `python -m dabuild.schemas` and commit schemas/"


def test_check_flag_detects_drift(tmp_path: Path) -> None:
    assert schemas.main(["--dir", str(tmp_path), "--check"]) == 1  # nothing written yet
    assert schemas.main(["--dir", str(tmp_path)]) == 0
    assert schemas.main(["--dir", str(tmp_path), "--check"]) == 0
    (tmp_path / "recipe.schema.json").write_text("{}\n")
    assert schemas.main(["--dir", str(tmp_path), "--check"]) == 1


@pytest.mark.parametrize("name", sorted(schemas.SCHEMAS))
def test_schemas_are_valid_and_documented(name: str) -> None:
    document = schema(name)
    jsonschema.Draft202012Validator.check_schema(document)
    assert document["$schema"] == schemas.DIALECT
    assert document["title"].startswith("dabuild ")
    assert document["additionalProperties"] is False
    for prop in document["properties"].values():
        assert prop.get("description"), prop


def test_valid_recipe_passes_the_recipe_schema() -> None:
    jsonschema.validate(VALID_RECIPE, schema("recipe.schema.json"))


@pytest.mark.parametrize(
    "break_it",
    [
        lambda r: r.update(tunning={}),
        lambda r: r["targets"][0].update(check_io={"tolerance": "loose"}),
        lambda r: r.update(targets=[]),
        lambda r: r.update(name="../escape"),
        lambda r: r["data"]["calibration"].update(samples=0),
        lambda r: r.pop("model"),
    ],
    ids=["unknown-key", "bad-enum", "no-targets", "bad-name", "zero-samples", "missing-model"],
)
def test_broken_recipes_fail_the_recipe_schema(break_it) -> None:
    recipe = copy.deepcopy(VALID_RECIPE)
    break_it(recipe)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(recipe, schema("recipe.schema.json"))


@pytest.mark.parametrize("path", BUNDLED_CAPABILITIES, ids=lambda p: p.name)
def test_bundled_capabilities_pass_the_capability_schema(path: Path) -> None:
    jsonschema.validate(yaml.safe_load(path.read_text(encoding="utf-8")), schema("capability.schema.json"))


def test_there_is_a_bundled_capability() -> None:
    assert BUNDLED_CAPABILITIES
