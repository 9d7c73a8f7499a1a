"""A connection to a Dask cluster, shared by what dabuild sends there: tuning trials and build stages.

It owns what both need to say in one line instead of Dask's tracebacks: a
scheduler that does not answer (within CONNECT_SECONDS), a task whose worker
died more often than the scheduler's `distributed.scheduler.allowed-failures`
allows (Dask itself reruns a task whose worker died, elsewhere; dabuild sets no
`retries`, which would rerun a task that raised, and a task's own error is
deterministic), a cluster left without workers for DABUILD_WORKERLESS_SECONDS (default 30), and a
lost scheduler. Whoever waits writes nothing of the task's results until they
have all come back, so each of these errors leaves nothing half-written.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from typing import Any

from distributed import Client, Future, KilledWorker

from dabuild.errors import BuildError, UsageError

CONNECT_SECONDS = 10
WORKERLESS = "DABUILD_WORKERLESS_SECONDS"
DEFAULT_WORKERLESS_SECONDS = 30.0  # a cluster without workers this long is an error, not a wait (a nanny restarts one sooner)
# Dask logs a lost connection as errors with tracebacks; dabuild says it as one line of its own
DASK_LOGGERS = ("distributed", "distributed.client")
_silencing = threading.Lock()
_silenced: dict[str, int] = {}  # while any Cluster lives (builds may run at once): each logger's own level
_clusters = [0]


def _silence_dask() -> None:
    with _silencing:
        if _clusters[0] == 0:
            _silenced.update({name: logging.getLogger(name).level for name in DASK_LOGGERS})
            for name in DASK_LOGGERS:
                logging.getLogger(name).setLevel(logging.CRITICAL)
        _clusters[0] += 1


def _unsilence_dask() -> None:
    with _silencing:
        _clusters[0] -= 1
        if _clusters[0] == 0:
            for name, level in _silenced.items():
                logging.getLogger(name).setLevel(level)


def workerless_seconds() -> float:
    """How long a cluster may have no worker while it has work before the build stops: DABUILD_WORKERLESS_SECONDS,
    default 30 (an autoscaler that takes minutes to start a worker wants more). UsageError for anything but a
    positive number of seconds."""
    text = os.environ.get(WORKERLESS, "").strip()
    if not text:
        return DEFAULT_WORKERLESS_SECONDS
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not seconds > 0 or math.isinf(seconds):
        raise UsageError(f"{WORKERLESS}={text!r}: expected a positive number of seconds")
    return seconds


class Cluster:
    """A Dask client at `address` (tcp://HOST:PORT); `task` names what runs there in messages ("a trial")."""

    def __init__(self, address: str, task: str, work: str):
        self.address = address
        self.task = task
        self.work = work  # what the client waits for, in messages: "trials to score"
        self.workerless_seconds = workerless_seconds()
        _silence_dask()
        try:
            self.client = Client(address, timeout=CONNECT_SECONDS, set_as_default=False)
        except (OSError, TimeoutError) as error:
            _unsilence_dask()
            raise BuildError(f"the Dask scheduler at {address} does not answer within {CONNECT_SECONDS}s "
                             f"({error})") from None

    def gather(self, futures: list[Future]) -> list[Any]:
        """The futures' results; BuildError (one line) when a worker died too often or the cluster is lost."""
        try:
            self._wait_while_workers_remain(futures)
            return list(self.client.gather(futures))
        except BuildError:
            raise
        except KilledWorker as error:
            raise BuildError(f"the Dask worker running {self.task} died {error.allowed_failures + 1} time(s) at "
                             f"{self.address} "
                             f"(the scheduler's distributed.scheduler.allowed-failures is {error.allowed_failures}); "
                             "the stage wrote nothing") from None
        except Exception as error:  # a lost scheduler surfaces as any of several errors
            if self.client.status != "running" or isinstance(error, OSError | TimeoutError):
                raise BuildError(f"lost the Dask scheduler at {self.address} mid-build; the stage wrote nothing"
                                 ) from None
            raise

    def _wait_while_workers_remain(self, futures: list[Future]) -> None:
        """Wait for the tasks; a cluster left without a worker (every one died) stops the build, not hangs it."""
        workerless_since: float | None = None
        pending = list(futures)
        while pending:
            try:
                pending[0].result(timeout=1)  # a task's error (KilledWorker) is raised here
                pending.pop(0)
                continue
            except TimeoutError:
                pass
            if self.client.nthreads():
                workerless_since = None
            elif workerless_since is None:
                workerless_since = time.monotonic()
            elif time.monotonic() - workerless_since > self.workerless_seconds:
                raise BuildError(f"the Dask cluster at {self.address} has had no workers for {self.workerless_seconds:g}s "
                                 f"with {self.work}; the stage wrote nothing")

    def close(self) -> None:
        self.client.close(timeout=CONNECT_SECONDS)
        _unsilence_dask()
