"""Loading valid recipes: resolved paths, filled-in defaults, YAML positions."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dabuild import plugins
from dabuild.capability import ENV_PATH
from dabuild.errors import ValidationError
from dabuild.recipe import _npz_shapes, load_recipe
from dabuild.yamlpos import MAX_NODES, YamlDocument, parse_yaml

MINIMAL = """\
name: tiny
model: {source: model.py:build}
data:
  calibration: {source: data/train.npz}
  evaluation: {source: data/test.npz, y: y}
targets:
  - {name: mcu, kind: c}
"""


@pytest.fixture(autouse=True)
def no_env_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_PATH, raising=False)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A recipe folder with a model file and train/test archives."""
    (tmp_path / "model.py").write_text("def build(weights):\n    return None\n")
    (tmp_path / "data").mkdir()
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "data" / "train.npz", x=rng.standard_normal((10, 3)).astype(np.float32))
    np.savez(tmp_path / "data" / "test.npz", x=np.zeros((4, 3), np.float32), y=np.arange(4))
    np.savez(tmp_path / "weights.npz", w=np.eye(3))
    return tmp_path


def write(folder: Path, text: str) -> Path:
    path = folder / "recipe.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_minimal_recipe_gets_documented_defaults(folder: Path) -> None:
    recipe = load_recipe(write(folder, MINIMAL))
    assert recipe.description == ""
    assert recipe.model.framework is None and recipe.model.weights is None and recipe.model.depends == []
    assert recipe.data.metric == "accuracy"
    assert (recipe.data.calibration.x, recipe.data.calibration.samples, recipe.data.calibration.batch_size) == (
        "x", None, 64,
    )
    tuning = recipe.tuning
    assert (tuning.strategy, tuning.max_trials, tuning.timeout) == (None, 100, 0)  # given or basic, by the model
    assert (tuning.accuracy.criterion, tuning.accuracy.tolerable_loss) == ("relative", 0.01)
    assert recipe.capabilities == []


def test_target_defaults_come_from_the_target_class(folder: Path) -> None:
    target_class = plugins.load(plugins.TARGETS, "c")
    (target,) = load_recipe(write(folder, MINIMAL)).targets
    assert target.capability == target_class.capability
    assert target.check_io.tolerance == target_class.default_tolerance
    assert target.options == target_class.Options().model_dump(mode="json")


def test_explicit_target_settings_are_kept(folder: Path, tmp_path: Path) -> None:
    (folder / "mine.yaml").write_text(
        "name: mine\nbackend: c\nversion: '1'\nprecisions: [int8]\nops: {default: {}}\n"
    )
    text = MINIMAL.replace("{name: mcu, kind: c}", "{name: mcu, kind: c, capability: mine, "
                           "options: {cflags: [-O3]}, check_io: {tolerance: very, samples: 2}}")
    recipe = load_recipe(write(folder, text + "capabilities: [mine.yaml]\n"))
    (target,) = recipe.targets
    assert (target.capability, target.check_io.tolerance, target.check_io.samples) == ("mine", "very", 2)
    assert target.options["cflags"] == ["-O3"]
    assert recipe.capabilities == [folder / "mine.yaml"]


def test_paths_are_absolute_and_relative_to_the_recipe_folder(
    folder: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = MINIMAL.replace("{source: model.py:build}", "{source: model.py:build, weights: weights.npz, depends: [model.py]}")
    path = write(folder, text)
    monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))
    recipe = load_recipe(path)
    assert recipe.path == path.resolve() and recipe.base_dir == folder.resolve()
    for resolved in [recipe.model.weights, recipe.data.calibration.source, recipe.data.evaluation.source, *recipe.model.depends]:
        assert resolved is not None and resolved.is_absolute() and resolved.is_file()
    assert recipe.data.calibration.source == folder.resolve() / "data" / "train.npz"
    assert recipe.model.source == "model.py:build"  # kept as written: planning keys its file by content (stage files)


def test_relative_recipe_path_is_resolved(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(folder, MINIMAL)
    monkeypatch.chdir(folder.parent)
    recipe = load_recipe(Path(folder.name) / "recipe.yaml")
    assert recipe.path == (folder / "recipe.yaml").resolve()


def test_module_and_model_file_sources_are_accepted_without_importing(folder: Path) -> None:
    recipe = load_recipe(write(folder, MINIMAL.replace("model.py:build", "no_such_package_xyz.models:make")))
    assert recipe.model.source == "no_such_package_xyz.models:make"
    assert "no_such_package_xyz" not in sys.modules
    (folder / "model.onnx").write_bytes(b"\x08\x07")
    assert load_recipe(write(folder, MINIMAL.replace("model.py:build", "model.onnx"))).model.source == "model.onnx"


def test_inputs_may_map_several_names_to_arrays(folder: Path) -> None:
    text = MINIMAL.replace("{source: data/train.npz}", "{source: data/train.npz, x: {a: x, b: x}}")
    assert load_recipe(write(folder, text)).data.calibration.x == {"a": "x", "b": "x"}


def test_anchors_aliases_and_merge_keys(folder: Path) -> None:
    text = """\
name: tiny
model: {source: model.py:build}
data:
  calibration: &train {source: data/train.npz, batch_size: 8}
  evaluation:
    <<: *train
    source: data/test.npz
    y: y
targets:
  - &mcu {name: mcu, kind: c}
  - {<<: *mcu, name: mcu2}
"""
    recipe = load_recipe(write(folder, text))
    assert recipe.data.evaluation.batch_size == 8
    assert recipe.data.evaluation.source.name == "test.npz"
    assert [t.name for t in recipe.targets] == ["mcu", "mcu2"]


def test_errors_inside_an_anchor_point_at_the_anchor(folder: Path) -> None:
    text = MINIMAL.replace("{source: data/train.npz}", "&d {source: data/train.npz, samples: 0}").replace(
        "evaluation: {source: data/test.npz, y: y}", "evaluation: {<<: *d, source: data/test.npz, y: y}"
    )
    with pytest.raises(ValidationError) as caught:
        load_recipe(write(folder, text))
    assert [(d.line, d.col) for d in caught.value.diagnostics] == [(4, 53), (4, 53)]


def test_npz_headers_give_numpy_shapes(tmp_path: Path) -> None:
    arrays = {
        "plain": np.zeros((5, 2, 3), np.float32),
        "fortran": np.asfortranarray(np.zeros((4, 7))),
        "records": np.zeros(6, dtype=[("a", "<i4"), ("b", "<f8", (2,))]),
        "scalar": np.int64(3),
        "empty": np.zeros((0,)),
    }
    for save in (np.savez, np.savez_compressed):
        path = tmp_path / f"{save.__name__}.npz"
        save(path, **arrays)
        assert _npz_shapes(path) == {name: np.load(path)[name].shape for name in arrays}


# ---------------------------------------------------------------- YAML positions


def parse(text: str) -> YamlDocument:
    return parse_yaml(text, "test.yaml")


def test_positions_of_keys_and_values() -> None:
    document = parse("a:\n  b: [1, {c: x}]\n  d:\n    - e\n")
    assert document.data == {"a": {"b": [1, {"c": "x"}], "d": ["e"]}}
    assert document.keys[("a", "b")] == (2, 3)
    assert document.values[("a", "b")] == (2, 6)
    assert document.values[("a", "b", 1, "c")] == (2, 14)
    assert document.keys[("a", "b", 1, "c")] == (2, 11)
    assert document.values[("a", "d", 0)] == (4, 7)


def test_position_walks_up_to_the_nearest_known_ancestor() -> None:
    document = parse("a:\n  b: 1\n")
    assert document.position(("a", "b", "no", "such")) == (2, 6)
    assert document.position(("a", "missing"), key=True) == (1, 1)
    assert document.position(("zzz",)) == (1, 1)


def test_scalars_keep_their_yaml_types() -> None:
    data = parse("i: 3\nf: 1.5\nb: true\nn: null\ns: '3'\nv: 1.0\n").data
    assert data == {"i": 3, "f": 1.5, "b": True, "n": None, "s": "3", "v": 1.0}


def test_duplicate_keys_are_problems_not_failures() -> None:
    document = parse("a: 1\nb: 2\na: 3\n")
    assert [str(p) for p in document.problems] == ["test.yaml:3:1: duplicate key 'a' (first defined at line 1)"]


def test_merge_key_override_is_not_a_duplicate() -> None:
    document = parse("base: &b {x: 1, y: 2}\nuse: {<<: *b, y: 3}\n")
    assert document.problems == []
    assert document.data["use"] == {"x": 1, "y": 3}


def test_alias_explosion_is_refused() -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 7)]
    with pytest.raises(ValidationError, match=f"more than {MAX_NODES} nodes"):
        parse("\n".join(lines) + "\n")


def test_python_tags_are_refused_even_on_keys() -> None:
    with pytest.raises(ValidationError, match="1:3: invalid YAML: unsupported tag .!!python/name:os.system."):
        parse("? !!python/name:os.system\n: 1\n")


def test_implicit_capability_must_exist(folder: Path, tmp_path_factory: pytest.TempPathFactory,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path_factory.mktemp("no-capabilities")
    monkeypatch.setattr("dabuild.capability.data_dir", lambda name: empty)
    with pytest.raises(ValidationError) as caught:
        load_recipe(write(folder, MINIMAL))
    assert [str(d) for d in caught.value.diagnostics] == [
        (f"{folder / 'recipe.yaml'}:7:23: target kind 'c' needs capability 'c', which no capability file defines;"
        " available: none")
    ]


def test_broken_capability_file_is_reported_with_the_recipe_problems(folder: Path) -> None:
    (folder / "mine.yaml").write_text("name: mine\nbackend: c\nversion: '1'\nprecisions: [int8]\nops: {dense: {}}\n")
    text = MINIMAL.replace("kind: c}", "kind: c, capability: mine}") + "capabilities: [mine.yaml]\ntunning: {}\n"
    with pytest.raises(ValidationError) as caught:
        load_recipe(write(folder, text))
    assert sorted((Path(d.file).name, d.line) for d in caught.value.diagnostics) == [
        ("mine.yaml", 5), ("recipe.yaml", 9),
    ]


def test_reloading_a_recipe_is_cheap(folder: Path) -> None:
    """load_recipe runs on every build, even a no-op one; the bound is loose, the typical cost ~2 ms."""
    path = write(folder, MINIMAL)
    load_recipe(path)  # imports and the target class
    start = time.perf_counter()
    for _ in range(10):
        load_recipe(path)
    assert (time.perf_counter() - start) / 10 < 0.1
