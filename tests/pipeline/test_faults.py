"""Fault drills: damaged entries in every store, full and read-only stores and build folders.

Each drill ends in the same artifacts as a clean build, with one warning per
fault, or in one clear error naming the path; never a traceback, and no
temporary file left behind. Full disks are real tmpfs mounts where this process
may mount (root); elsewhere those drills are skipped, and the injected-error
drills below (an OSError(ENOSPC) raised at the store's write boundary) still run.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from dabuild.cli import main
from dabuild.ir.kernels import compiling, native

ARTIFACT_STAGES = ("trace", "calibrate", "tune-c", "export-mcu")


def _build(recipe: Path, build_root: Path, capsys: pytest.CaptureFixture, *extra: str) -> tuple[int, str]:
    native._load.cache_clear()  # each build as a new process would: the kernel is found (and proven) again
    code = main(["build", str(recipe), "--build-dir", str(build_root), "-q", *extra])
    return code, capsys.readouterr().err


def _outputs(build_dir: Path) -> dict[str, bytes]:
    return {f"{stage}/{p.relative_to(build_dir / stage).as_posix()}": p.read_bytes()
            for stage in ARTIFACT_STAGES for p in sorted((build_dir / stage).rglob("*")) if p.is_file()}


def _warnings(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("dabuild: warning:")]


@pytest.fixture
def kernel_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "kernels"
    monkeypatch.setenv(compiling.KERNEL_CACHE, str(folder))
    yield folder
    native._load.cache_clear()


def _flip_digit(text: str, after: str) -> str:
    """`text` with the first digit after `after` changed (a single flipped digit, same length)."""
    start = text.index(after) + len(after)
    index = next(i for i in range(start, len(text)) if text[i].isdigit() and text[i] != "0")
    return text[:index] + str((int(text[index]) + 1) % 10) + text[index + 1:]


def test_damage_in_every_store_is_dropped_rebuilt_and_reported_once(
        digits: Path, tmp_path: Path, cache_dir: Path, kernel_cache: Path, capsys: pytest.CaptureFixture) -> None:
    code, err = _build(digits, tmp_path / "build", capsys)
    assert code == 0 and not _warnings(err)
    clean = _outputs(tmp_path / "build" / "digits-mlp")

    # run cache: one byte of the stored tuned graph flipped (same size, so only hashing tells)
    tune_key = json.loads((tmp_path / "build" / "digits-mlp" / "tune-c" / ".manifest.json").read_text())["key"]
    entry = cache_dir / "v1" / "entries" / tune_key[:2] / tune_key
    stored = entry / "config.json"
    stored.chmod(0o644)
    stored.write_text(_flip_digit(stored.read_text(), ""))
    # trial store: one digit of every stored score flipped
    records = sorted((cache_dir / "v1" / "trials").glob("*/*/*.json"))
    assert records
    for record in records:
        record.write_text(_flip_digit(record.read_text(), '"metric": '))
    # kernel cache: the compiled library truncated (loading it would be a bus error); written as a new
    # file, because this process still has the old one mapped (truncating that in place crashes it here)
    [library] = compiling.kernel_files()
    (kernel_cache / "truncated").write_bytes(library.read_bytes()[:1000])
    os.replace(kernel_cache / "truncated", library)

    shutil.rmtree(tmp_path / "build")
    code, err = _build(digits, tmp_path / "build", capsys)
    assert code == 0 and "Traceback" not in err
    warned = _warnings(err)
    assert len([w for w in warned if "run cache entry" in w and "tune" in w]) == 1
    assert len([w for w in warned if "trial store record" in w]) == len(records)
    assert len([w for w in warned if "compiled kernel" in w and "damaged" in w]) == 1
    assert len(warned) == 2 + len(records)
    summary = json.loads((tmp_path / "build" / "digits-mlp" / "build.json").read_text())
    assert summary["warnings"] == [w.removeprefix("dabuild: warning: ") for w in warned]
    assert _outputs(tmp_path / "build" / "digits-mlp") == clean  # artifacts unchanged
    assert all(compiling.proven(p) for p in compiling.kernel_files())

    code, err = _build(digits, tmp_path / "build2", capsys)  # everything proven now: no more warnings
    assert code == 0 and not _warnings(err)


def _can_mount() -> bool:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    probe = Path(os.environ.get("TMPDIR", "/tmp")) / f"dabuild-mount-probe-{os.getpid()}"
    probe.mkdir(exist_ok=True)
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe)],
                                 check=False, capture_output=True).returncode == 0
        if mounted:
            subprocess.run(["umount", str(probe)], check=True)
        return mounted
    finally:
        probe.rmdir()


MOUNTS = pytest.mark.skipif(not _can_mount(), reason="needs to mount a tmpfs (root); the injected drills run instead")


@contextmanager
def _tmpfs(folder: Path, size: str, read_only: bool = False) -> Iterator[Path]:
    """A tmpfs of `size` at `folder`, the user's own (mode 0700: a fresh tmpfs is world-writable, which the
    trust model rightly takes for a shared cache that serves only signed entries)."""
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700{',ro' if read_only else ''}", "tmpfs",
                    str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


def _files(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


@MOUNTS
def test_full_cache_builds_without_it_with_one_warning(digits: Path, tmp_path: Path, kernel_cache: Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture) -> None:
    code, _ = _build(digits, tmp_path / "clean", capsys, "--no-cache")
    clean = _outputs(tmp_path / "clean" / "digits-mlp")
    with _tmpfs(tmp_path / "cache", "24k") as cache:
        monkeypatch.setenv("DABUILD_CACHE", str(cache))
        code, err = _build(digits, tmp_path / "build", capsys)
        assert code == 0 and "Traceback" not in err
        warned = _warnings(err)
        assert len([w for w in warned if "run cache" in w and "cannot be written" in w]) == 1
        assert _outputs(tmp_path / "build" / "digits-mlp") == clean
        assert not [name for name in _files(cache) if "/tmp/" in name or ".trial-" in name]


@MOUNTS
def test_read_only_cache_and_kernel_cache_build_with_one_warning_each(
        digits: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    code, _ = _build(digits, tmp_path / "clean", capsys, "--no-cache")
    clean = _outputs(tmp_path / "clean" / "digits-mlp")
    with _tmpfs(tmp_path / "cache", "1m", read_only=True) as cache, \
            _tmpfs(tmp_path / "kernels", "1m", read_only=True) as kernels:
        monkeypatch.setenv("DABUILD_CACHE", str(cache))
        monkeypatch.setenv(compiling.KERNEL_CACHE, str(kernels))
        code, err = _build(digits, tmp_path / "build", capsys)
        native._load.cache_clear()
        assert code == 0 and "Traceback" not in err
        warned = _warnings(err)
        assert len([w for w in warned if str(kernels) in w and "cannot be written" in w]) == 1
        assert len([w for w in warned if "run cache" in w and "cannot be written" in w]) == 1
        assert len([w for w in warned if "trial store" in w and "cannot be written" in w]) == 1
        assert len(warned) == 3
    assert _outputs(tmp_path / "build" / "digits-mlp") == clean  # the native kernels still ran


@MOUNTS
def test_full_build_folder_is_an_error_naming_the_path(digits: Path, tmp_path: Path, cache_dir: Path,
                                                       capsys: pytest.CaptureFixture) -> None:
    with _tmpfs(tmp_path / "build", "64k") as build_root:
        code, err = _build(digits, build_root, capsys)
        assert code == 1 and "Traceback" not in err
        [line] = [line for line in err.splitlines() if line.startswith("dabuild: error:")]
        assert "no space left on the device of" in line and str(build_root) in line and "free" in line
        assert not (build_root / "digits-mlp" / ".tmp").exists() or not _files(build_root / "digits-mlp" / ".tmp")


# ---------------------------------------------------------------- injected at the write boundary


def test_store_that_fills_up_warns_once_and_leaves_no_temporary(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """OSError(ENOSPC) injected where the store copies a file in (what a full disk raises there)."""
    from dabuild import notices
    from dabuild.pipeline import store as store_module
    from dabuild.pipeline.hashing import hash_value
    from dabuild.pipeline.manifest import Manifest

    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "graph.json").write_text("{}")

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(args[1]))

    monkeypatch.setattr(store_module.shutil, "copy2", full)
    store = store_module.Store(tmp_path / "cache")
    with notices.collect() as warned:
        for n in range(3):
            parts = {"n": n}
            store.save(folder, Manifest.of_folder(folder, "trace", hash_value(parts), parts))
    assert len(warned) == 1 and "No space left on device" in warned[0] and str(store.root) in warned[0]
    assert _files(tmp_path / "cache") == []


def test_trial_store_that_cannot_be_written_warns_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """OSError(ENOSPC) injected at the trial store's write boundary (mkstemp)."""
    from dabuild import notices
    from dabuild.tune import trials
    from dabuild.tune.evaluate import Score

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(trials.tempfile, "mkstemp", full)
    store = trials.TrialStore(tmp_path / "trials", "ab" * 32)
    with notices.collect() as warned:
        for n in range(3):
            store.put(f"config{n}", Score(0.5, 0.1, 1.0))
    assert len(warned) == 1 and "trial store" in warned[0]
    assert store.get("config0") is None


def test_trial_record_from_another_config_fails_its_proof(tmp_path: Path) -> None:
    from dabuild import notices
    from dabuild.tune.evaluate import Score
    from dabuild.tune.trials import TrialStore

    store = TrialStore(tmp_path, "cd" * 32)
    store.put("good", Score(0.9, 0.01, 1.0))
    store.put("bad", Score(0.1, 0.5, 1.0))
    assert store.get("good") == Score(0.9, 0.01, 1.0)
    assert store.folder is not None
    shutil.copy(store.folder / "good.json", store.folder / "bad.json")  # a valid record, of another config
    with notices.collect() as warned:
        assert store.get("bad") is None
    assert len(warned) == 1 and not (store.folder / "bad.json").exists()


def test_prune_covers_every_store_and_its_temporaries(digits: Path, tmp_path: Path, cache_dir: Path,
                                                      kernel_cache: Path, capsys: pytest.CaptureFixture) -> None:
    assert _build(digits, tmp_path / "build", capsys)[0] == 0
    (cache_dir / "v1" / "tmp" / "half-entry").mkdir(parents=True)
    context = next((cache_dir / "v1" / "trials").glob("*/*"))
    (context / ".trial-leftover").write_text("{")
    (kernel_cache / ".build-leftover").mkdir()
    assert main(["cache", "info"]) == 0
    info = capsys.readouterr().out
    for store in ("run cache", "trial store", "compiled kernels"):
        assert store in info
    assert "KiB" in info and "bytes" not in info
    assert main(["cache", "prune", "--max-size", "0"]) == 0
    assert _files(cache_dir) == [] and _files(kernel_cache) == []
    assert list(kernel_cache.iterdir()) == []


# ---------------------------------------------------------------- interrupts


SLOW_TRACE = ("import time\n\nfrom model import build as fast\n\n\n"
              "def build(weights):\n    time.sleep({delay})\n    return fast(weights)\n")


SLOW_METRIC = ("import time\n\nimport numpy as np\n\n\ndef score(outputs, labels):\n    time.sleep(1.0)\n"
               "    return float(np.mean(np.argmax(outputs, axis=1) == labels))\n")


@pytest.mark.parametrize("moment", [0.2, 1.5, 2.5])
def test_ctrl_c_under_j_ends_with_one_line_and_exit_130(digits: Path, tmp_path: Path, moment: float) -> None:
    """SIGINT to the whole process group, as a terminal's Ctrl-C sends it, `moment` seconds after the build
    took its lock: while tracing (1 s), calibrating or tuning with worker processes (-j 2 scores trials in two
    spawned processes; each score takes 1 s, so the build is still tuning at the last moment on any machine)."""
    import signal
    import sys
    import time

    (digits / "model_slow.py").write_text(SLOW_TRACE.format(delay=1.0))
    (digits / "slow_accuracy.py").write_text(SLOW_METRIC)  # tuning lasts seconds, however fast the machine
    recipe = digits / "recipe.yaml"
    recipe.write_text(recipe.read_text().replace("source: model.py:build", "source: model_slow.py:build")
                      .replace("metric: accuracy", "metric: slow_accuracy.py:score"))
    env = dict(os.environ, DABUILD_CACHE=str(tmp_path / "cache"))
    # the build gets Ctrl-C's default action, as a terminal's foreground job has it: a test run that a shell
    # started in the background (`pytest &`, no job control) ignores SIGINT, and a child inherits an ignored signal
    # (a handled one starts at its default)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        process = subprocess.Popen([sys.executable, "-m", "dabuild", "build", str(digits), "--build-dir",
                                    str(tmp_path / "build"), "-j", "2"], env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, start_new_session=True)
    finally:
        signal.signal(signal.SIGINT, previous)
    lock = tmp_path / "build" / "digits-mlp" / ".lock"
    started = time.monotonic()
    while not (lock.exists() and lock.read_text().strip() == str(process.pid)):
        assert time.monotonic() - started < 60 and process.poll() is None, "the build never took its lock"
        time.sleep(0.01)
    time.sleep(moment)
    os.killpg(process.pid, signal.SIGINT)
    _out, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    assert "Traceback" not in err and "Error" not in err
    assert err.rstrip().splitlines()[-1] == "dabuild: interrupted"
    assert err.count("dabuild: interrupted") == 1


def test_build_folder_that_fills_up_is_one_error_naming_it(digits: Path, tmp_path: Path, cache_dir: Path,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture) -> None:
    """OSError(ENOSPC) injected where a stage's manifest is written into the build folder's .tmp/ (what a full
    disk raises there; the tmpfs drill above does it for real where it may mount)."""
    from dabuild.pipeline import manifest

    write = manifest.Manifest.write

    def full(self: manifest.Manifest, folder: Path) -> None:
        if self.stage == "calibrate":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(folder / manifest.MANIFEST))
        write(self, folder)

    monkeypatch.setattr(manifest.Manifest, "write", full)
    code, err = _build(digits, tmp_path / "build", capsys)
    assert code == 1 and "Traceback" not in err
    [line] = [line for line in err.splitlines() if line.startswith("dabuild: error:")]
    assert line.startswith("dabuild: error: calibrate: no space left on the device of ")
    assert str(tmp_path / "build" / "digits-mlp" / ".tmp") in line and "free" in line and "it had written" in line
    assert _files(tmp_path / "build" / "digits-mlp" / ".tmp") == []
