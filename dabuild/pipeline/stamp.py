"""The no-op fast path: answer "nothing to do" before importing anything heavy.

A successful build leaves a stamp: the stat signature (size, mtime) of every file
the build read (the recipe, the model and data files, the capability files and
folders) and of every output file, plus the summary it printed. When a later
`dabuild build` finds every signature unchanged, it prints that summary and stops
without loading pydantic, numpy or doit, like ninja's no-op. Any difference at
all, or a missing stamp, falls back to the full build, where doit and the
manifests decide. The stamp is keyed by the recipe file, the selected targets and
the build root, and removed when a build of that recipe starts.

This module imports only the standard library.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from pathlib import Path
from typing import Any

STAMPS = ".stamps"
_CAPABILITY_ENV = "DABUILD_CAPABILITY_PATH"
_NATIVE_ENV = "DABUILD_NATIVE_KERNELS"  # numpy or compiled convs in the interpreter (dabuild.ir.kernels.native)


def stamp_path(recipe_path: Path, build_root: Path, targets: tuple[str, ...] | None) -> Path:
    identity = json.dumps([str(recipe_path.resolve()), sorted(targets) if targets else None])
    return Path(os.path.abspath(build_root)) / STAMPS / (hashlib.sha256(identity.encode()).hexdigest()[:24] + ".json")


def signature(path: Path) -> list[int] | None:
    try:
        info = path.stat()
    except OSError:
        return None
    return [info.st_size, info.st_mtime_ns]


def _code_signature() -> str:
    """The size and mtime of every file of the dabuild package: any edit to its code leaves the fast path
    (the full build then compares each stage's code digest, pipeline/code_digest.py)."""
    package = Path(__file__).resolve().parent.parent
    entries = sorted(f"{path.relative_to(package)}:{signature(path)}" for path in package.rglob("*")
                     if path.is_file() and "__pycache__" not in path.parts)
    return hashlib.sha256("\n".join(entries).encode()).hexdigest()


def _environment() -> dict[str, object]:
    from dabuild import __version__

    return {
        "dabuild": __version__,
        "code": _code_signature(),
        _CAPABILITY_ENV: os.environ.get(_CAPABILITY_ENV, ""),
        _NATIVE_ENV: os.environ.get(_NATIVE_ENV, ""),
    }


def write(stamp: Path, read: list[Path], outputs: list[Path], summary: dict[str, Any]) -> None:
    """Record a successful build (written atomically: a torn stamp would only cost a slow path)."""
    data = {
        "environment": _environment(),
        "read": {str(p): signature(p) for p in read},
        "outputs": {str(p): signature(p) for p in outputs},
        "summary": summary,
    }
    stamp.parent.mkdir(parents=True, exist_ok=True)
    _write_atomically(stamp, data)


def _write_atomically(stamp: Path, data: dict[str, Any]) -> None:
    partial = stamp.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(json.dumps(data))
    os.replace(partial, stamp)


def remove(stamp: Path) -> None:
    stamp.unlink(missing_ok=True)


def _fresh(data: dict[str, Any]) -> bool:
    if data.get("environment") != _environment():
        return False
    return all(
        recorded is not None and signature(Path(name)) == recorded
        for group in ("read", "outputs")
        for name, recorded in data.get(group, {}).items()
    )


def noop(stamp: Path) -> dict[str, Any] | None:
    """If nothing the last build read or wrote has changed, record a no-op build and return its summary.

    The build folder's lock is taken without waiting: a build in progress means
    the answer is not known here, and the caller takes the full path (which waits).
    """
    if stamp.parent.is_symlink() or stamp.parent.parent.is_symlink():  # the build refuses the link by name
        return None
    try:
        data = json.loads(stamp.read_text())
        build_dir = Path(data["summary"]["build_dir"])
        fd = os.open(build_dir / ".lock", os.O_RDWR | os.O_NOFOLLOW)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if not _fresh(data):
            return None
        summary = data["summary"]
        summary["outcomes"] = dict.fromkeys(summary["outcomes"], "up to date")
        summary["counts"] = {"executed": 0, "restored from cache": 0, "up to date": len(summary["outcomes"])}
        report = build_dir / "build.json"
        report.write_text(json.dumps(summary, indent=2) + "\n")
        data["outputs"][str(report)] = signature(report)
        _write_atomically(stamp, data)
        return summary
    except OSError:
        return None
    finally:
        os.close(fd)
