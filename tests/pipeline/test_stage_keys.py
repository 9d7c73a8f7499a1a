"""A stage is a pure function of its key: change everything its key leaves out and its outputs stay byte for byte.

One build of the digits example (C target, a file metric), then a second, cache
off, from a different working directory, with the recipe renamed, its
description, target name and tuning budget's unkeyed neighbours changed, and
every user file moved and renamed (same content; the metric file only moved,
as its spec names it). Every stage folder of the
second build must equal the first's file by file, manifest included.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support import DIGITS

from dabuild.cli import main

METRIC = "def score(outputs, labels):\n    return float((outputs.argmax(-1) == labels).mean())\n"


def _recipe(name: str, model: str, weights: str, data: str, metric: str, target: str, description: str) -> str:
    return f"""name: {name}
description: {description}
model:
  framework: numpy
  source: {model}:build
  weights: {weights}
  inputs: {{x: [null, 64]}}
data:
  calibration: {{source: {data}, x: x_train, samples: 256}}
  evaluation: {{source: {data}, x: x_test, y: y_test, samples: 200}}
  metric: {metric}:score
tuning:
  max_trials: 4
targets:
  - name: {target}
    kind: c
    options: {{cflags: [-O2]}}
"""


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _build(recipe: Path, build_root: Path, cwd: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    monkeypatch.chdir(cwd)
    assert main(["build", str(recipe), "--build-dir", str(build_root), "--no-cache", "-q"]) == 0
    name = recipe.read_text().splitlines()[0].split(":", 1)[1].strip()
    return json.loads((build_root / name / "build.json").read_text())


def test_stage_outputs_depend_on_nothing_outside_their_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            cache_dir: Path) -> None:
    first = tmp_path / "first"
    first.mkdir()
    for name in ("model.py", "weights.npz", "data.npz"):
        shutil.copy(DIGITS / name, first / name)
    (first / "metric.py").write_text(METRIC)
    (first / "recipe.yaml").write_text(_recipe("one", "model.py", "weights.npz", "data.npz", "metric.py", "mcu",
                                               "first"))
    second = tmp_path / "elsewhere" / "deeper"
    for folder in ("nets", "arrays"):
        (second / folder).mkdir(parents=True)
    shutil.copy(DIGITS / "model.py", second / "nets" / "mlp_forward.py")
    shutil.copy(DIGITS / "weights.npz", second / "arrays" / "params.npz")
    shutil.copy(DIGITS / "data.npz", second / "arrays" / "digits_split.npz")
    (second / "metric.py").write_text(METRIC)  # the metric's spec (its relative path) is keyed: same spec
    (second / "renamed.yaml").write_text(_recipe("two", "nets/mlp_forward.py", "arrays/params.npz",
                                                 "arrays/digits_split.npz", "metric.py", "board",
                                                 "a different description"))
    (tmp_path / "cwd1").mkdir()
    (tmp_path / "cwd2").mkdir()

    one = _build(first / "recipe.yaml", tmp_path / "build1", tmp_path / "cwd1", monkeypatch)
    two = _build(second / "renamed.yaml", tmp_path / "out" / "build2", tmp_path / "cwd2", monkeypatch)

    assert set(one["outcomes"].values()) == set(two["outcomes"].values()) == {"executed"}
    pairs = {"trace": "trace", "calibrate": "calibrate", "tune-c": "tune-c", "export-mcu": "export-board",
             "check-mcu": "check-board"}
    for left, right in pairs.items():
        a, b = _tree(tmp_path / "build1" / "one" / left), _tree(tmp_path / "out" / "build2" / "two" / right)
        assert a.keys() == b.keys(), left
        differing = [name for name in a if a[name] != b[name]]
        assert not differing, f"{left}: {differing} differ although only unkeyed inputs changed"
    assert (tmp_path / "build1" / "one" / "tune-c" / "report" / "report.md").read_text().startswith(
        "# Tuning report: capability c")
