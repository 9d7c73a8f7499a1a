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

