"""Files from strangers: each hostile case (corpus/hostile/cases.py) is built by the real CLI in a subprocess
under a memory and a time limit, and must end in a clear error naming the file, without a traceback, without
its payload running (no MARKER file) and within the limits."""

from __future__ import annotations

import importlib.util
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
from corpus.hostile.cases import CASES, MARKER

MEMORY_LIMIT = 6 * 1024**3  # address space: torch maps ~2 GiB on import; a payload that allocates dies here
TIME_LIMIT = 120  # a minute is the goal; the margin is for a loaded machine importing torch and keras
NEEDS = {"pt2": "torch", "torch": "torch", "keras": "keras", "onnx": "onnx"}
SLOW = ("pt2", "torch", "keras")  # they import torch (and keras): 20 s or more each on two busy cores


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def run_limited(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m dabuild ARGS` in `cwd` under the memory and time limits."""
    environment = {**os.environ, "DABUILD_CACHE": str(cwd / "cache"), **(env or {})}
    return subprocess.run([sys.executable, "-m", "dabuild", *args], cwd=cwd, env=environment, capture_output=True,
                          text=True, timeout=TIME_LIMIT, preexec_fn=_limited, check=False)


@pytest.mark.parametrize("name", [pytest.param(name, marks=[pytest.mark.slow] if name.startswith(SLOW) else [])
                                  for name in sorted(CASES)])
def test_hostile_file_is_refused_cleanly(name: str, tmp_path: Path) -> None:
    needed = NEEDS.get(name.split("_")[0])
    if needed and importlib.util.find_spec(needed) is None:
        pytest.skip(f"{needed} is not installed")
    folder = tmp_path / "project"
    folder.mkdir()
    expected = CASES[name](folder)
    start = time.monotonic()
    result = run_limited(["build", "--build-dir", "build", "recipe.yaml"], folder)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "Traceback" not in output, output
    for part in expected:
        assert part in output, f"{part!r} not in {output}"
    assert not (folder / MARKER).exists(), "the payload ran"
    assert time.monotonic() - start < TIME_LIMIT


# ------------------------------------------------------------------ the build folder and links


def _project(tmp_path: Path) -> tuple[Path, Path]:
    """A small numpy project and, beside it, a folder with a file a link could reach."""
    folder, outside = tmp_path / "project", tmp_path / "elsewhere"
    folder.mkdir()
    outside.mkdir()
    (outside / "victim").write_text("keep me")
    CASES["npz_weights_object_array"](folder)  # any project; the build must stop before reading it
    return folder, outside


@pytest.mark.parametrize("link", ["build", "build/hostile", "build/hostile/trace", "build/.stamps"])
def test_build_refuses_a_link_it_did_not_make(link: str, tmp_path: Path) -> None:
    folder, outside = _project(tmp_path)
    (folder / link).parent.mkdir(parents=True, exist_ok=True)
    (folder / link).symlink_to(outside, target_is_directory=True)
    result = run_limited(["build", "--build-dir", "build", "recipe.yaml"], folder)
    output = result.stdout + result.stderr
    assert result.returncode == 2 and "Traceback" not in output, output
    assert f"{folder / link}: " in output and "symbolic link" in output, output
    assert sorted(p.name for p in outside.iterdir()) == ["victim"], "something was written through the link"


@pytest.mark.parametrize("link", ["build/hostile", "build/hostile/trace", "build/hostile/victim"])
def test_clean_removes_links_never_what_they_point_to(link: str, tmp_path: Path) -> None:
    folder, outside = _project(tmp_path)
    (folder / "build" / "hostile").mkdir(parents=True, exist_ok=link != "build/hostile")
    if link == "build/hostile":
        (folder / link).rmdir()
    target = outside / "victim" if link.endswith("victim") else outside
    (folder / link).symlink_to(target)
    result = run_limited(["clean", "--build-dir", "build", "recipe.yaml"], folder)
    assert result.returncode == 0, result.stdout + result.stderr
    assert not (folder / link).is_symlink()
    assert (outside / "victim").read_text() == "keep me"


def test_clean_refuses_a_linked_build_root(tmp_path: Path) -> None:
    folder, outside = _project(tmp_path)
    (outside / "hostile").mkdir()
    (folder / "build").symlink_to(outside, target_is_directory=True)
    result = run_limited(["clean", "--build-dir", "build", "recipe.yaml"], folder)
    assert result.returncode == 2 and f"{folder / 'build'}: the build folder is a symbolic link" in result.stderr
    assert (outside / "victim").exists() and (outside / "hostile").is_dir()
