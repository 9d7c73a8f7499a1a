"""Export and check stages as Dask tasks, exchanging inputs and outputs through the team's remote cache.

With `--executor dask://HOST:PORT` and a remote this user may write, each
export and check stage (one of each per target; they depend on no other
target's) runs on a worker: the client first makes sure the remote holds the
entries of the stage's inputs (it pushes any it has only locally), then sends
the stage (plain data: its config, input keys, key parts) to a worker. The
worker pulls each input entry by its key (signature checked, every blob
re-hashed), runs the stage function into a scratch folder, and pushes the
outputs as a signed entry; it returns nothing but their digest. The client then
restores that entry from the remote into the build folder, as a warm remote
would, so the artifacts are byte-identical to a local build's and the build
folder is the same product it always is (a user asked for these artifacts; the
cluster saves this machine the compute, not the bytes).

Workers hold the team key (it travels in the task), as any writer of the
remote does: run them where CI runs, on a network the team trusts. A worker's
warnings stay in its own log; a worker that cannot reach the remote makes
the stage run on the client, with one warning. A worker lost mid-stage is retried by the
scheduler (dabuild.cluster), and a half-pushed entry is never read: the remote
writes its record after its blobs. A lost scheduler is one error; the client
has published nothing of the stage. Without a writable remote, stages run on
the client and only trials go to the cluster (build.py says so in one line).
"""

from __future__ import annotations

import tempfile
import threading
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dabuild.errors import BuildError
from dabuild.notices import warn
from dabuild.pipeline.execute import StageRun
from dabuild.pipeline.manifest import Manifest
from dabuild.pipeline.plan import Stage
from dabuild.pipeline.remote import Remote
from dabuild.pipeline.remote_settings import RemoteSettings
from dabuild.pipeline.store import Store
from dabuild.progress import Progress
from dabuild.trust import TeamKey

if TYPE_CHECKING:
    from dabuild.cluster import Cluster

DISTRIBUTED_KINDS = ("export", "check")
TASK_PREFIX = "dabuild-stage-"  # the Dask keys of stage tasks (tests inject faults by it)


class WorkerRemoteFailure(Exception):
    """A worker could not use the remote (unreachable from it, a backend not installed there): the stage
    then runs on the client, as a failing remote never fails a build."""


def run_on_worker(stage: Stage, input_keys: dict[str, str], key: str, parts: dict[str, Any],
                  settings: RemoteSettings, team_key: TeamKey) -> str:
    """In a Dask worker: pull the inputs by key, run the stage, push its signed entry; its digest."""
    from dabuild.pipeline.stages import stage_functions

    remote = Remote(settings, team_key)
    with tempfile.TemporaryDirectory(prefix=TASK_PREFIX) as scratch:
        root = Path(scratch)
        inputs = {}
        for role, input_key in input_keys.items():
            inputs[role] = root / "inputs" / role
            inputs[role].mkdir(parents=True)
            if remote.fetch(input_key, inputs[role]) is None:
                raise WorkerRemoteFailure(f"a Dask worker could not fetch its input {stage.inputs[role]!r} "
                                          f"(entry {input_key[:12]}) from the remote {remote.url}")
        out = root / "out"
        out.mkdir()
        stage_functions()[stage.kind](StageRun(stage, out, inputs, root / "build", Progress.silent()))
        manifest = Manifest.of_folder(out, stage.kind, key, parts)
        if not remote.push(out, manifest):
            raise WorkerRemoteFailure(f"a Dask worker could not push its outputs to the remote {remote.url}")
        return manifest.digest


class StageCluster:
    """Runs the stages it takes on a Dask cluster, through the store's remote (which must take pushes)."""

    def __init__(self, address: str, store: Store):
        assert store.remote is not None and store.remote.settings.push
        self.address = address
        self.store = store
        self.remote: Remote = store.remote
        self._cluster: Cluster | None = None
        self._lock = threading.Lock()

    def takes(self, stage: Stage) -> bool:
        return stage.kind in DISTRIBUTED_KINDS and not self.remote.failed

    def run(self, stage: Stage, inputs: dict[str, Manifest], key: str, parts: dict[str, Any],
            dest: Path) -> Manifest | None:
        """Run `stage` on a worker and restore its entry into the empty folder `dest`; None when its inputs
        cannot be put on the remote or the worker cannot use it (the caller then runs the stage here)."""
        for role, manifest in inputs.items():
            if not self.store.push(manifest.key):
                warn(f"{stage.name}: its input {stage.inputs[role]!r} could not be put on the remote "
                     f"{self.remote.url}, so it runs on this machine, not on the Dask cluster",
                     key=f"stage cluster {stage.name}")
                return None
        cluster = self._connected()
        future = cluster.client.submit(
            run_on_worker, stage, {role: m.key for role, m in inputs.items()}, key, parts, self.remote.settings,
            self.remote.key, key=f"{TASK_PREFIX}{stage.dirname}-{uuid.uuid4().hex}", pure=False)
        try:
            cluster.gather([future])
        except WorkerRemoteFailure as failure:
            warn(f"{stage.name}: {failure} (see the worker's log); it runs on this machine instead",
                 key=f"stage cluster {stage.name}")
            return None
        restored = self.store.restore_remote(key, dest)
        if restored is None:
            raise BuildError(f"{stage.name}: it ran on the Dask cluster at {self.address}, but its entry could not "
                             f"be fetched from the remote {self.remote.url}")
        return restored

    def _connected(self) -> Cluster:
        from dabuild.cluster import Cluster

        with self._lock:
            if self._cluster is None:
                self._cluster = Cluster(self.address, "a stage", "stages to run")
            return self._cluster

    def close(self) -> None:
        if self._cluster is not None:
            self._cluster.close()
