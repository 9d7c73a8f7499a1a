"""Capability files: loading, per-op lookup, and discovery from the three sources."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dabuild.capability import ENV_PATH, discover_capabilities, load_capability
from dabuild.errors import ValidationError
from dabuild.resources import data_dir


def write_capability(path: Path, name: str, dtype: str = "int8") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"name: {name}\nbackend: {name}\nversion: '1'\nprecisions: [{dtype}]\n"
        f"ops:\n  default:\n    weight: {{dtype: [{dtype}]}}\n  relu: {{}}\n",
        encoding="utf-8",
    )
    return path


def test_loads_with_defaults_and_remembers_its_file(tmp_path: Path) -> None:
    path = write_capability(tmp_path / "mine.yaml", "mine")
    spec = load_capability(path)
    assert spec.path == path.resolve()
    weight = spec.ops["default"].weight
    assert weight is not None
    assert (weight.dtype, weight.scheme, weight.granularity, weight.algorithm) == (
        ["int8"], ["sym"], ["per_tensor"], ["minmax"]
    )
    assert spec.fp32_fallback is False and spec.description == ""


def test_for_op_falls_back_to_default(tmp_path: Path) -> None:
    spec = load_capability(write_capability(tmp_path / "mine.yaml", "mine"))
    assert spec.for_op("relu") is spec.ops["relu"]
    assert spec.for_op("conv2d") is spec.ops["default"]


def test_bundled_capabilities_are_discovered() -> None:
    bundled = sorted(data_dir("capabilities").glob("*.yaml"))
    specs = discover_capabilities()
    assert {spec.path for spec in specs.values()} == {path.resolve() for path in bundled}
    assert "c" in specs and specs["c"].for_op("dense").weight is not None


def test_env_path_takes_folders_and_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_capability(tmp_path / "folder" / "a.yaml", "alpha")
    write_capability(tmp_path / "folder" / "b.yaml", "beta")
    (tmp_path / "folder" / "notes.txt").write_text("not a capability")
    single = write_capability(tmp_path / "single.yaml", "gamma")
    monkeypatch.setenv(ENV_PATH, f"{tmp_path / 'folder'}{os.pathsep}{single}")
    assert {"alpha", "beta", "gamma", "c"} <= set(discover_capabilities())


def test_missing_env_path_entry_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_PATH, str(tmp_path / "nowhere"))
    with pytest.raises(ValidationError, match=f"\\${ENV_PATH} names a path that does not exist"):
        discover_capabilities()


def test_duplicate_installed_names_are_an_error_naming_both_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = write_capability(tmp_path / "one" / "x.yaml", "twin")
    second = write_capability(tmp_path / "two" / "x.yaml", "twin")
    monkeypatch.setenv(ENV_PATH, f"{first}{os.pathsep}{second}")
    with pytest.raises(ValidationError) as caught:
        discover_capabilities()
    (diagnostic,) = caught.value.diagnostics
    assert (diagnostic.file, diagnostic.line, diagnostic.col) == (str(second.resolve()), 1, 7)
    assert diagnostic.message == f"capability 'twin' is already defined in {first.resolve()}"


def test_env_path_may_not_shadow_a_bundled_capability(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_PATH, str(write_capability(tmp_path / "c.yaml", "c", "int4")))
    with pytest.raises(ValidationError, match="capability 'c' is already defined in"):
        discover_capabilities()


def test_a_recipe_file_overrides_a_bundled_capability(tmp_path: Path) -> None:
    mine = write_capability(tmp_path / "c.yaml", "c", "int4")
    specs = discover_capabilities([mine])
    assert specs["c"].path == mine.resolve()
    assert specs["c"].for_op("dense").weight.dtype == ["int4"]


def test_two_recipe_files_of_one_name_are_an_error(tmp_path: Path) -> None:
    first = write_capability(tmp_path / "a.yaml", "twin")
    second = write_capability(tmp_path / "b.yaml", "twin")
    with pytest.raises(ValidationError, match=f"already defined in {first.resolve()}"):
        discover_capabilities([first, second])


def test_one_file_reached_twice_is_not_a_duplicate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_capability(tmp_path / "mine.yaml", "mine")
    monkeypatch.setenv(ENV_PATH, str(tmp_path))
    assert discover_capabilities([path])["mine"].path == path.resolve()


def test_problems_in_several_files_are_reported_together(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("name: a\n")
    (tmp_path / "b.yaml").write_text("- not a mapping\n")
    with pytest.raises(ValidationError) as caught:
        discover_capabilities([tmp_path])
    files = {Path(d.file).name for d in caught.value.diagnostics}
    assert files == {"a.yaml", "b.yaml"}
