"""Builds that are killed or that race each other never leave outputs a later build accepts wrongly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dabuild.pipeline.manifest import Manifest

SLOW_MODEL = '''\
import time

from model import build as build_fast


def build(weights):
    time.sleep({delay})
    return build_fast(weights)
'''


def _slow(recipe_dir: Path, delay: float) -> None:
    (recipe_dir / "model_slow.py").write_text(SLOW_MODEL.format(delay=delay))
    path = recipe_dir / "recipe.yaml"
    path.write_text(path.read_text().replace("source: model.py:build", "source: model_slow.py:build"))


def _start(recipe_dir: Path, build_root: Path, cache: Path, *extra: str) -> subprocess.Popen:
    env = dict(os.environ, DABUILD_CACHE=str(cache))
    return subprocess.Popen(
        [sys.executable, "-m", "dabuild", "build", str(recipe_dir), "--build-dir", str(build_root), *extra],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _digests(build_dir: Path) -> dict[str, str]:
    """Stage folder -> digest of its outputs, for every folder that a build would accept."""
    found = {}
    for folder in sorted(p for p in build_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
        manifest = Manifest.read(folder)
        if manifest is not None:
            assert manifest.matches(folder, deep=True), f"{folder} has a manifest its files do not match"
            found[folder.name] = manifest.digest
    return found


def _assert_cache_entries_verify(cache: Path) -> None:
    entries = cache / "v1" / "entries"
    for entry in entries.glob("*/*") if entries.exists() else []:
        manifest = Manifest.read(entry)
        assert manifest is not None, f"cache entry {entry} has no manifest but is in place"
        assert manifest.matches(entry, deep=True), f"cache entry {entry} does not match its manifest"


@pytest.mark.slow
def test_sigkill_at_any_moment_then_rebuild(digits: Path, tmp_path: Path) -> None:
    reference_root, root, cache = tmp_path / "reference", tmp_path / "build", tmp_path / "cache"
    start = time.monotonic()
    reference = _start(digits, reference_root, tmp_path / "reference-cache", "--no-cache", "-q")
    assert reference.wait(timeout=300) == 0, reference.stderr.read()
    cold = time.monotonic() - start
    expected = _digests(reference_root / "digits-mlp")
    assert {"trace", "calibrate", "tune-c", "export-mcu", "check-mcu"} <= set(expected)

    kills = 6
    for index in range(1, kills + 1):
        process = _start(digits, root, cache, "-q")
        time.sleep(cold * index / (kills + 1))
        process.send_signal(signal.SIGKILL)
        process.wait()
        build_dir = root / "digits-mlp"
        if build_dir.exists():
            accepted = _digests(build_dir)
            assert all(expected[name] == digest for name, digest in accepted.items() if name != "check-mcu")
        _assert_cache_entries_verify(cache)

    final = _start(digits, root, cache, "-q")
    assert final.wait(timeout=300) == 0, final.stderr.read()
    result = _digests(root / "digits-mlp")
    assert {name: result[name] for name in expected if name != "check-mcu"} == {
        name: digest for name, digest in expected.items() if name != "check-mcu"
    }
    assert not list((root / "digits-mlp" / ".tmp").glob("*"))


@pytest.mark.slow
def test_kill_during_a_slow_stage_leaves_no_accepted_output(digits: Path, tmp_path: Path) -> None:
    _slow(digits, delay=30)
    process = _start(digits, tmp_path / "build", tmp_path / "cache", "-q")
    tmp_root = tmp_path / "build" / "digits-mlp" / ".tmp"
    # No fixed start-up time: a loaded machine (or a first kernel compile) may take minutes to reach trace.
    deadline = time.monotonic() + 600
    while not list(tmp_root.glob("trace-*")) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process.poll() is None, f"the build ended before its trace stage started: {process.stderr.read()}"
    assert list(tmp_root.glob("trace-*")), "the trace stage never started in 10 minutes"
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (tmp_path / "build" / "digits-mlp" / "trace").exists()
    _slow(digits, delay=0)
    rebuilt = _start(digits, tmp_path / "build", tmp_path / "cache", "-q")
    assert rebuilt.wait(timeout=300) == 0, rebuilt.stderr.read()
    assert "trace" in _digests(tmp_path / "build" / "digits-mlp")


@pytest.mark.slow
def test_two_builds_on_one_folder_take_turns(digits: Path, tmp_path: Path) -> None:
    _slow(digits, delay=3)
    first = _start(digits, tmp_path / "build", tmp_path / "cache")
    time.sleep(1.0)
    second = _start(digits, tmp_path / "build", tmp_path / "cache")
    _out1, err1 = first.communicate(timeout=300)
    out2, err2 = second.communicate(timeout=300)
    assert first.returncode == 0, err1
    assert second.returncode == 0, err2
    assert "waiting for another dabuild" in err2
    assert "0 executed" in out2  # the second found everything done by the first
    _digests(tmp_path / "build" / "digits-mlp")
