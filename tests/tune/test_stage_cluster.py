"""Export and check stages as Dask tasks through a file:// remote: the local build's artifacts, byte for byte.

The clusters are real and on localhost (a LocalCluster of 2 worker processes;
`dask scheduler` plus 2 `dask worker` processes, tests/tune/test_dask_executor.py);
a worker is SIGKILLed when the first stage task starts on it (tests/dask_faults.py).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from test_dask_executor import _build, _cli, _cluster

from dabuild.cli import main

pytest.importorskip("distributed", reason="the dask extra is not installed (pip install 'dabuild[dask]')")
TEAM_KEY = "a-team-key-of-32-characters-xyz!"


@pytest.fixture
def team_remote(tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    remote = tmp_path / "remote"
    monkeypatch.setenv("DABUILD_REMOTE", f"file://{remote}")
    monkeypatch.setenv("DABUILD_CACHE_KEY", TEAM_KEY)
    return remote


def _read(build_dir: Path, recipe: str = "digits-mlp") -> dict[str, bytes]:
    folder = build_dir / recipe
    return {str(p.relative_to(folder)): p.read_bytes() for stage in ("tune-c", "export-mcu", "check-mcu")
            for p in sorted((folder / stage).rglob("*")) if p.is_file()}


def _local(recipe: Path, build_dir: Path) -> dict[str, bytes]:
    files = _build(recipe, build_dir)
    files.pop("history")
    return files


def _stage_tasks(scheduler: Any) -> list[str]:
    """The names of the stage tasks the scheduler ran (by their key's prefix)."""
    return sorted(name for name in scheduler.task_prefixes if name.startswith("dabuild-stage-"))


@pytest.mark.slow  # worker processes that import the quantization stack: tens of seconds here
def test_stages_on_a_local_cluster_give_the_local_build_byte_for_byte(
        digits: Path, tmp_path: Path, team_remote: Path) -> None:
    from distributed import LocalCluster

    local = _local(digits, tmp_path / "local")
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None) as cluster:
        address = cluster.scheduler_address.replace("tcp://", "dask://")
        assert main(["build", str(digits), "--build-dir", str(tmp_path / "dask"), "-q", "--executor", address]) == 0
        ran = _stage_tasks(cluster.scheduler)
    assert _read(tmp_path / "dask") == local
    assert ran == ["dabuild-stage-check-mcu", "dabuild-stage-export-mcu"]  # both ran on the workers


@pytest.mark.slow
def test_a_worker_killed_mid_stage_changes_nothing(digits: Path, tmp_path: Path, team_remote: Path) -> None:
    from tests.dask_faults import STAGE_PREFIX, KillOnFirstTrial

    local = _local(digits, tmp_path / "local")
    with _cluster(tmp_path / "dask.log", allowed_failures=1) as cluster:  # one retry, as the issue asks
        with cluster.client() as client:
            client.register_plugin(KillOnFirstTrial(tmp_path / "killed", prefix=STAGE_PREFIX))
        assert main(["build", str(digits), "--build-dir", str(tmp_path / "dask"), "-q",
                     "--executor", cluster.address]) == 0
        assert (tmp_path / "killed").exists()  # a worker did die as a stage started on it
        assert sum(worker.poll() is not None for worker in cluster.workers) == 1

        def times_retried(dask_scheduler: Any) -> int:  # in the scheduler's process, sent by value
            return sum(prefix.suspicious for name, prefix in dask_scheduler.task_prefixes.items()
                       if name.startswith("dabuild-stage-"))

        with cluster.client() as client:
            retried = client.run_on_scheduler(times_retried)
        assert retried >= 1  # ... and its stage ran again, on the other worker
    assert _read(tmp_path / "dask") == local


@pytest.mark.slow
def test_a_scheduler_lost_mid_stage_is_one_error_and_publishes_nothing(
        digits: Path, tmp_path: Path, team_remote: Path) -> None:
    from tests.dask_faults import STAGE_PREFIX, KillOnFirstTrial

    build_dir = tmp_path / "b"
    with _cluster(tmp_path / "dask.log") as cluster:
        with cluster.client() as client:
            client.register_plugin(KillOnFirstTrial(tmp_path / "killed", victim=cluster.scheduler.pid,
                                                    prefix=STAGE_PREFIX))
        result = _cli("build", str(digits), "--build-dir", str(build_dir), "-q", "--executor", cluster.address,
                      timeout=180)
        assert cluster.scheduler.wait(timeout=10) == -9  # the scheduler was SIGKILLed as the first stage started
    address = cluster.address.replace("dask://", "tcp://")
    assert result.returncode == 1 and result.stderr.splitlines() == [
        f"dabuild: error: lost the Dask scheduler at {address} mid-build; the stage wrote nothing"], result.stderr
    folder = build_dir / "digits-mlp"
    assert {p.name for p in folder.iterdir() if p.is_dir() and "-" in p.name} == {"tune-c"}  # no export, no check
    assert not list((folder / ".tmp").glob("*"))  # and no temporary left behind


@pytest.mark.slow
def test_two_recipes_in_one_command_build_at_once_on_the_cluster(
        digits: Path, tmp_path: Path, team_remote: Path) -> None:
    from distributed import LocalCluster
    from distributed.diagnostics.task_stream import TaskStreamPlugin

    twin = tmp_path / "twin"
    shutil.copytree(digits, twin)
    # another C flag: the twin's export and check are stages of their own, not ones the first recipe's run
    # may have published to the cache before the twin's started
    (twin / "recipe.yaml").write_text((digits / "recipe.yaml").read_text()
                                      .replace("name: digits-mlp", "name: digits-twin", 1)
                                      .replace("cflags: [-O2]", "cflags: [-O1]", 1))
    assert main(["build", str(digits), str(twin), "--build-dir", str(tmp_path / "local"), "--no-cache", "-q"]) == 0
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None) as cluster:
        stream = TaskStreamPlugin(cluster.scheduler)
        cluster.scheduler.add_plugin(stream)
        address = cluster.scheduler_address.replace("tcp://", "dask://")
        assert main(["build", str(digits), str(twin), "--build-dir", str(tmp_path / "dask"), "-q",
                     "--executor", address]) == 0
        keys = [str(record["key"]) for record in stream.buffer]
    for name in ("digits-mlp", "digits-twin"):
        assert _read(tmp_path / "dask", name) == _read(tmp_path / "local", name)
    for stage in ("export-mcu", "check-mcu"):  # each recipe's ran on the workers
        assert sum(key.startswith(f"dabuild-stage-{stage}-") for key in keys) == 2, keys
