"""Faults the Dask tests inject from inside the cluster, at a known moment: test code, imported by the
workers the tests start (through PYTHONPATH), never by dabuild."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

TRIAL_PREFIX = "_score_on_worker-"  # the keys of dabuild's trials (dabuild/tune/dask_executor.py)
STAGE_PREFIX = "dabuild-stage-"  # the keys of its stages (dabuild/pipeline/stage_cluster.py)


class KillOnFirstTrial(WorkerPlugin):
    """SIGKILLs `victim` (None: the worker itself) when the first trial of the whole cluster starts
    executing on a worker; a marker file created exclusively makes it once across workers (`every`:
    the first trial on each worker, so every worker dies). `prefix` picks other tasks: STAGE_PREFIX."""

    name = "dabuild-test-kill-on-first-trial"

    def __init__(self, marker: Path, victim: int | None = None, every: bool = False, prefix: str = TRIAL_PREFIX):
        self.marker = str(marker)
        self.prefix = prefix
        self.victim = victim
        self.every = every

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        if finish != "executing" or not str(key).startswith(self.prefix):
            return
        try:
            os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            if not self.every:
                return  # another trial already fired it
        os.kill(self.victim or os.getpid(), signal.SIGKILL)
