"""Trials scored on a Dask cluster: the same artifacts and trial history as a local build.

Clusters run on localhost and are started and stopped here: a LocalCluster of 2
worker processes, and `dask scheduler` plus 2 `dask worker` processes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dabuild.cli import main
from tests.remote_servers import free_port

pytest.importorskip("distributed", reason="the dask extra is not installed (pip install 'dabuild[dask]')")
BIN = Path(sys.executable).parent


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


@pytest.fixture
def scheduler_and_workers(tmp_path: Path) -> Iterator[tuple[str, list[subprocess.Popen]]]:
    """`dask scheduler` and 2 `dask worker` processes on localhost."""
    port = free_port()
    logs = open(tmp_path / "dask.log", "wb")  # noqa: SIM115 - closed below, after the processes
    scheduler = subprocess.Popen([str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", str(port),
                                  "--no-dashboard"], stdout=logs, stderr=logs)
    workers = [subprocess.Popen([str(BIN / "dask"), "worker", f"tcp://127.0.0.1:{port}", "--nworkers", "1",
                                 "--nthreads", "1", "--no-nanny", "--no-dashboard", "--host", "127.0.0.1"],
                                stdout=logs, stderr=logs) for _ in range(2)]
    try:
        from distributed import Client

        with Client(f"tcp://127.0.0.1:{port}", timeout=60) as client:
            client.wait_for_workers(2, timeout=120)
        yield f"dask://127.0.0.1:{port}", workers
    finally:
        for process in [*workers, scheduler]:
            process.terminate()
        for process in [*workers, scheduler]:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:  # a worker still shutting down on a loaded machine
                process.kill()
                process.wait()
        logs.close()


@pytest.mark.slow
def test_a_scheduler_and_worker_processes_give_the_local_build_byte_for_byte(
        digits: Path, tmp_path: Path, local_result: dict[str, bytes],
        scheduler_and_workers: tuple[str, list[subprocess.Popen]]) -> None:
    address, _ = scheduler_and_workers
    assert _build(digits, tmp_path / "dask", "--executor", address) == local_result


def test_an_executor_that_does_not_answer_is_one_line_within_seconds(
        digits: Path, tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    start = time.monotonic()
    code = main(["build", str(digits), "--build-dir", str(tmp_path / "b"), "--no-cache", "-q",
                 "--executor", f"dask://127.0.0.1:{free_port()}"])
    error = capsys.readouterr().err.strip()
    assert code == 1 and "does not answer within 10s" in error and "Traceback" not in error
    assert time.monotonic() - start < 120  # the trace and calibrate stages, then at most 10 s of waiting


def test_a_malformed_executor_is_a_usage_error(digits: Path, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DABUILD_EXECUTOR", "dask://nowhere")
    assert main(["build", str(digits)]) == 2
    assert "expected `local` or `dask://HOST:PORT`" in capsys.readouterr().err
