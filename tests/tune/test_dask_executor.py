"""Trials scored on a Dask cluster: the same artifacts and trial history as a local build.

Clusters run on localhost and are started and stopped here: a LocalCluster of 2
worker processes, and `dask scheduler` plus 2 `dask worker` processes. Faults
come at a known moment from inside the cluster (tests/dask_faults.py, a worker
plugin of the tests): when the first trial starts executing, a real SIGKILL of
that worker or of the scheduler.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dabuild.cli import main
from tests.remote_servers import free_port

pytest.importorskip("distributed", reason="the dask extra is not installed (pip install 'dabuild[dask]')")
BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]


def _build(recipe: Path, build_dir: Path, *flags: str) -> dict[str, bytes]:
    assert main(["build", str(recipe), "--build-dir", str(build_dir), "--no-cache", "-q", *flags]) == 0
    folder = build_dir / "digits-mlp"
    files = {str(p.relative_to(folder)): p.read_bytes() for stage in ("tune-c", "export-mcu", "check-mcu")
             for p in sorted((folder / stage).rglob("*")) if p.is_file()}
    history = [json.loads(line) for line in (folder / "history" / "tune-c.jsonl").read_text().splitlines()]
    for trial in history:
        trial.pop("seconds")  # how long it took is the one thing that may differ
    files["history"] = json.dumps(history).encode()
    return files


@pytest.fixture
def local_result(digits: Path, tmp_path: Path, cache_dir: Path) -> dict[str, bytes]:
    return _build(digits, tmp_path / "local")


@pytest.mark.slow  # starting worker processes that import the quantization stack: tens of seconds here
def test_a_local_cluster_gives_the_local_build_byte_for_byte(
        digits: Path, tmp_path: Path, local_result: dict[str, bytes]) -> None:
    from distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None) as cluster:
        address = cluster.scheduler_address.replace("tcp://", "dask://")
        assert _build(digits, tmp_path / "dask", "--executor", address) == local_result


@dataclass
class Cluster:
    """`dask scheduler` and 2 `dask worker` processes (no nanny: a killed worker stays dead) on localhost."""

    address: str  # dask://127.0.0.1:PORT
    scheduler: subprocess.Popen
    workers: list[subprocess.Popen]

    def client(self) -> Any:
        from distributed import Client

        return Client(self.address.replace("dask://", "tcp://"), timeout=60, set_as_default=False)


def _stop(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:  # still shutting down on a loaded machine
            process.kill()
            process.wait(timeout=30)


@contextlib.contextmanager
def _cluster(logs_path: Path, allowed_failures: int = 3) -> Iterator[Cluster]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO),  # the workers import tests/dask_faults.py
           "DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": str(allowed_failures)}
    processes: list[subprocess.Popen] = []
    with open(logs_path, "wb") as logs:
        try:
            processes.append(subprocess.Popen(
                [str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
                stdout=logs, stderr=logs, env=env))
            processes += [subprocess.Popen(
                [str(BIN / "dask"), "worker", f"tcp://127.0.0.1:{port}", "--nworkers", "1", "--nthreads", "1",
                 "--no-nanny", "--no-dashboard", "--host", "127.0.0.1"], stdout=logs, stderr=logs, env=env)
                for _ in range(2)]
            cluster = Cluster(f"dask://127.0.0.1:{port}", processes[0], processes[1:])
            with cluster.client() as client:
                client.wait_for_workers(2, timeout=120)
            yield cluster
        finally:
            _stop(processes[1:])  # the workers first: without their scheduler they linger, reconnecting
            _stop(processes[:1])


@pytest.fixture
def scheduler_and_workers(tmp_path: Path) -> Iterator[Cluster]:
    with _cluster(tmp_path / "dask.log") as cluster:
        yield cluster


@pytest.mark.slow
def test_a_scheduler_and_worker_processes_give_the_local_build_byte_for_byte(
        digits: Path, tmp_path: Path, local_result: dict[str, bytes],
        scheduler_and_workers: Cluster) -> None:
    assert _build(digits, tmp_path / "dask", "--executor", scheduler_and_workers.address) == local_result


def test_an_executor_that_does_not_answer_is_one_line_within_seconds(
        digits: Path, tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    start = time.monotonic()
    address = f"127.0.0.1:{free_port()}"
    code = main(["build", str(digits), "--build-dir", str(tmp_path / "b"), "--no-cache", "--executor", f"dask://{address}"])
    error = capsys.readouterr().err
    assert code == 1 and "does not answer within 10s" in error and "Traceback" not in error
    # without a remote cache the stages stay here, and the build says so in one line
    assert (f"dabuild: no remote cache this build may write, so its stages run on this machine and only tuning "
            f"trials go to the Dask cluster at tcp://{address}\n") in error
    assert time.monotonic() - start < 120  # the trace and calibrate stages, then at most 10 s of waiting


def test_a_malformed_executor_is_a_usage_error(digits: Path, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DABUILD_EXECUTOR", "dask://nowhere")
    assert main(["build", str(digits)]) == 2
    assert "expected `local` or `dask://HOST:PORT`" in capsys.readouterr().err


@pytest.mark.parametrize("seconds", ["0", "-5", "soon", "inf"])
def test_a_bad_workerless_wait_is_a_usage_error(seconds: str, digits: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DABUILD_WORKERLESS_SECONDS", seconds)
    assert main(["build", str(digits), "--build-dir", str(tmp_path / "b"), "--executor", "dask://127.0.0.1:1"]) == 2
    assert capsys.readouterr().err == (f"dabuild: error: DABUILD_WORKERLESS_SECONDS={seconds!r}: expected a positive "
                                       "number of seconds\n")
    assert not (tmp_path / "b").exists()  # refused before anything was built


def _trials_rescheduled(cluster: Cluster) -> int:
    """How many times the scheduler took a trial from a worker that died while it ran (Dask's "suspicious")."""
    from dask.utils import key_split

    from tests.dask_faults import TRIAL_PREFIX

    name = key_split(TRIAL_PREFIX + uuid.uuid4().hex)  # the scheduler's name for the trials' task prefix

    def count(dask_scheduler: Any) -> int:
        prefix = dask_scheduler.task_prefixes.get(name)
        return 0 if prefix is None else prefix.suspicious

    with cluster.client() as client:
        return int(client.run_on_scheduler(count))


@pytest.mark.slow
def test_a_worker_killed_mid_trial_changes_nothing(
        digits: Path, tmp_path: Path, local_result: dict[str, bytes]) -> None:
    from tests.dask_faults import KillOnFirstTrial

    with _cluster(tmp_path / "dask.log", allowed_failures=1) as cluster:  # one retry, as the issue asks
        with cluster.client() as client:
            client.register_plugin(KillOnFirstTrial(tmp_path / "killed"))
        assert _build(digits, tmp_path / "dask", "--executor", cluster.address) == local_result
        assert (tmp_path / "killed").exists()  # a worker did die while it ran a trial
        assert sum(worker.poll() is not None for worker in cluster.workers) == 1
        assert _trials_rescheduled(cluster) >= 1  # ... and its trial was run again, on the other worker


def _cli(*args: str, timeout: float) -> subprocess.CompletedProcess:
    """dabuild in a process of its own: its stderr is everything a user would see, Dask's logging included."""
    return subprocess.run([sys.executable, "-m", "dabuild", *args], capture_output=True, text=True, timeout=timeout,
                          check=False)


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


@pytest.mark.slow
def test_a_trial_whose_workers_all_die_is_one_error(digits: Path, tmp_path: Path, cache_dir: Path) -> None:
    from tests.dask_faults import KillOnFirstTrial

    with _cluster(tmp_path / "dask.log", allowed_failures=0) as cluster:  # no retry: the first death is final
        with cluster.client() as client:
            client.register_plugin(KillOnFirstTrial(tmp_path / "killed"))
        result = _cli("build", str(digits), "--build-dir", str(tmp_path / "b"), "-q", "--executor", cluster.address,
                      timeout=180)
    address = cluster.address.replace("dask://", "tcp://")
    expected = (f"dabuild: error: the Dask worker running a trial died 1 time(s) at {address} (the scheduler's "
                "distributed.scheduler.allowed-failures is 0); the stage wrote nothing")
    assert result.returncode == 1 and result.stderr.splitlines() == [expected], result.stderr
    assert (tmp_path / "killed").exists() and not (tmp_path / "b" / "digits-mlp" / "tune-c").exists()


@pytest.mark.slow  # waits out DABUILD_WORKERLESS_SECONDS
def test_a_cluster_whose_every_worker_died_is_one_error_not_a_hang(
        digits: Path, tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.dask_faults import KillOnFirstTrial

    monkeypatch.setenv("DABUILD_WORKERLESS_SECONDS", "4")  # the default 30 s, shortened: the wait is what is tested

    with _cluster(tmp_path / "dask.log") as cluster:  # 3 failures allowed: the trial outlives its 2 workers
        with cluster.client() as client:
            client.register_plugin(KillOnFirstTrial(tmp_path / "killed", every=True))
        start = time.monotonic()
        result = _cli("build", str(digits), "--build-dir", str(tmp_path / "b"), "-q", "--executor", cluster.address,
                      timeout=180)
        seconds = time.monotonic() - start
        assert all(worker.wait(timeout=10) == -9 for worker in cluster.workers)
    address = cluster.address.replace("dask://", "tcp://")
    expected = (f"dabuild: error: the Dask cluster at {address} has had no workers for 4s "
                "with trials to score; the stage wrote nothing")
    assert result.returncode == 1 and result.stderr.splitlines() == [expected], result.stderr
    assert 4 < seconds < 4 + 90
    assert not (tmp_path / "b" / "digits-mlp" / "tune-c").exists()


@pytest.mark.slow
def test_a_scheduler_lost_mid_build_is_one_error_and_writes_nothing_half(
        digits: Path, tmp_path: Path, cache_dir: Path) -> None:
    from tests.dask_faults import KillOnFirstTrial

    build_dir = tmp_path / "b"
    with _cluster(tmp_path / "dask.log") as cluster:
        with cluster.client() as client:
            client.register_plugin(KillOnFirstTrial(tmp_path / "killed", victim=cluster.scheduler.pid))
        start = time.monotonic()
        result = _cli("build", str(digits), "--build-dir", str(build_dir), "-q", "--executor", cluster.address,
                      timeout=180)
        seconds = time.monotonic() - start
        assert cluster.scheduler.wait(timeout=10) == -9  # the scheduler was SIGKILLed mid-build
    address = cluster.address.replace("dask://", "tcp://")
    assert result.returncode == 1 and result.stderr.splitlines() == [
        f"dabuild: error: lost the Dask scheduler at {address} mid-build; the stage wrote nothing"], result.stderr
    assert seconds < 120
    # nothing half-written: trace and calibrate whole in the build folder and the store, nothing of tune
    # but its journal (append-only, outside the stage's outputs: whole lines of the trials that finished)
    folder = build_dir / "digits-mlp"
    stage_files = {p for p in _files(folder) if "/" in p and not p.startswith("history/")}
    assert {p.split("/")[0] for p in stage_files} == {"trace", "calibrate"}
    assert all(json.loads(line) for line in (folder / "history" / "tune-c.jsonl").read_text().splitlines())
    stored = _files(cache_dir)
    assert all(p.startswith("v1/entries/") for p in stored), stored  # no temporaries left
    assert sorted(p.split("/", 4)[4] for p in stored) == sorted(p.split("/", 1)[1] for p in stage_files)
    assert len({p.split("/")[3] for p in stored}) == 2  # the two entries, each with its manifest
