"""Running one stage under the run cache, atomically.

For a stage: compute its key from the manifests of its inputs; if the folder in
place already carries that key, nothing to do; if the store has it, restore it;
if the team's remote has it, fetch it;
otherwise run the stage function (an export or check stage, on a Dask
cluster's worker when the build has one and a remote: pipeline/stage_cluster.py) into a temporary folder, record a manifest,
store it, and rename the folder into place. The outputs a later build accepts
are therefore always complete: an interrupted stage leaves only a temporary
folder, which the next build removes.
"""

from __future__ import annotations

import enum
import errno
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from dabuild.errors import BuildError
from dabuild.ir.memory import release_free_memory
from dabuild.pipeline.manifest import Manifest
from dabuild.pipeline.plan import Stage, cache_key, input_digests, key_parts
from dabuild.pipeline.store import Store
from dabuild.progress import Progress, human_size

if TYPE_CHECKING:
    from dabuild.pipeline.stage_cluster import StageCluster


class Outcome(enum.Enum):
    EXECUTED = "executed"
    RESTORED = "restored from cache"
    RESTORED_REMOTE = "restored from the remote"
    UP_TO_DATE = "up to date"


@dataclass(frozen=True)
class StageRun:
    """What a stage function gets: where to write, where its inputs are, how to report."""

    stage: Stage
    out_dir: Path
    inputs: dict[str, Path]
    build_dir: Path
    progress: Progress


StageFunction = Callable[[StageRun], None]


@dataclass
class Workspace:
    """The build folder of one recipe and the rules for publishing into it."""

    build_dir: Path

    @property
    def tmp_root(self) -> Path:
        return self.build_dir / ".tmp"

    def stage_dir(self, name: str) -> Path:
        return self.build_dir / name.replace(":", "-")

    def clear_leftovers(self) -> None:
        """Remove temporary folders of interrupted builds (called while holding the lock)."""
        shutil.rmtree(self.tmp_root, ignore_errors=True)

    def new_tmp(self, stage: Stage) -> Path:
        self.tmp_root.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=stage.dirname + "-", dir=self.tmp_root))

    def publish(self, tmp: Path, stage: Stage) -> None:
        """Swap the finished folder into place; the old one is moved aside first, then removed."""
        final = self.stage_dir(stage.name)
        if final.exists():
            retired = self.tmp_root / f"{stage.dirname}-retired-{os.getpid()}-{time.monotonic_ns()}"
            os.rename(final, retired)
            shutil.rmtree(retired, ignore_errors=True)
        os.rename(tmp, final)


@dataclass
class Session:
    """Executes stages of one build and records what happened to each."""

    workspace: Workspace
    store: Store | None
    functions: dict[str, StageFunction]
    progress: Progress
    cluster: StageCluster | None = None  # runs the stages it takes on a Dask cluster (pipeline/stage_cluster.py)
    outcomes: dict[str, tuple[Outcome, float]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def input_manifests(self, stage: Stage) -> dict[str, Manifest]:
        manifests = {}
        for role, upstream in stage.inputs.items():
            manifest = Manifest.read(self.workspace.stage_dir(upstream))
            if manifest is None:
                raise BuildError(f"{stage.name}: input {upstream!r} has no complete outputs")
            manifests[role] = manifest
        return manifests

    def run(self, stage: Stage) -> Outcome:
        start = time.monotonic()
        try:
            outcome = self._run(stage)
        finally:
            release_free_memory()  # the next stage starts from what is live, not from this one's peak
        elapsed = time.monotonic() - start
        with self._lock:
            self.outcomes[stage.name] = (outcome, elapsed)
        self.progress.info(f"{stage.name:<24} {outcome.value} ({elapsed:.2f}s)")
        return outcome

    def _run(self, stage: Stage) -> Outcome:
        try:
            return self._run_in_place(stage)
        except OSError as error:  # the build folder (or a scratch folder) failed to take the outputs
            raise BuildError(write_failure(stage.name, error, self.workspace.build_dir)) from None

    def _run_in_place(self, stage: Stage) -> Outcome:
        inputs = self.input_manifests(stage)
        parts = key_parts(stage, input_digests(stage, inputs))
        key = cache_key(parts)
        final = self.workspace.stage_dir(stage.name)
        current = Manifest.read(final)
        if current is not None and current.key == key and current.matches(final, deep=False):
            return Outcome.UP_TO_DATE
        tmp = self.workspace.new_tmp(stage)
        try:
            if self.store is not None:
                for fetch, outcome in ((self.store.restore, Outcome.RESTORED),
                                       (self.store.restore_remote, Outcome.RESTORED_REMOTE)):
                    restored = fetch(key, tmp)
                    if restored is not None:
                        restored.write(tmp)
                        self.workspace.publish(tmp, stage)
                        return outcome
                    shutil.rmtree(tmp)
                    tmp.mkdir()
            if self.cluster is not None and self.cluster.takes(stage):
                ran = self.cluster.run(stage, inputs, key, parts, tmp)
                if ran is not None:
                    ran.write(tmp)
                    self.workspace.publish(tmp, stage)
                    return Outcome.EXECUTED
            self.functions[stage.kind](
                StageRun(
                    stage,
                    tmp,
                    {role: self.workspace.stage_dir(stage.inputs[role]) for role in inputs},
                    self.workspace.build_dir,
                    self.progress,
                )
            )
            manifest = Manifest.of_folder(tmp, stage.kind, key, parts)
            manifest.write(tmp)
            if self.store is not None:
                self.store.save(tmp, manifest)
            self.workspace.publish(tmp, stage)
            return Outcome.EXECUTED
        except OSError as error:
            written = sum(p.stat().st_size for p in tmp.rglob("*") if p.is_file()) if tmp.is_dir() else 0
            raise BuildError(write_failure(stage.name, error, self.workspace.build_dir, written)) from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


NO_ROOM = (errno.ENOSPC, errno.EDQUOT)


def write_failure(stage: str, error: OSError, build_dir: Path, written: int | None = None) -> str:
    """What a user can act on when writing failed: which path, and for a full disk, how much room is
    there and how much the stage had written when it ran out (it needs more than that)."""
    path = Path(error.filename) if error.filename else build_dir
    if error.errno not in NO_ROOM:
        return f"{stage}: {path}: {error.strerror or error}"
    folder = path if path.is_dir() else path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        free = human_size(shutil.disk_usage(folder).free)
    except OSError:
        free = "unknown"
    needed = f"; it had written {human_size(written)} and needs more: free at least that much" if written else ""
    return f"{stage}: no space left on the device of {path} ({free} free){needed}, or choose another --build-dir"
