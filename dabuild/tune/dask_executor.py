"""The Dask implementation of dabuild.tune.executors.TrialExecutor (see there for the design)."""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from dataclasses import replace
from typing import Any

from distributed import Client, Future, KilledWorker
from distributed.diagnostics.plugin import WorkerPlugin

from dabuild.errors import BuildError
from dabuild.quant.config import QuantConfig
from dabuild.tune.evaluate import EvalSetup, Evaluator, Score

CONNECT_SECONDS = 10
WORKERLESS_SECONDS = 30  # a cluster without workers this long is an error, not a wait (a nanny restarts one sooner)
# Dask logs a lost connection as errors with tracebacks; dabuild says it as one line of its own
DASK_LOGGERS = ("distributed", "distributed.client")

_evaluators: dict[str, Evaluator] = {}  # in a Dask worker process: the evaluators its plugins built


class EvaluatorPlugin(WorkerPlugin):
    """Sent to each worker once: builds the worker's Evaluator from the setup."""

    def __init__(self, setup: EvalSetup, token: str):
        self.setup_data = setup
        self.token = token
        self.name = f"dabuild-evaluator-{token}"

    def setup(self, worker: Any) -> None:
        _evaluators[self.token] = Evaluator(replace(self.setup_data, threads=1))  # one trial per worker thread

    def teardown(self, worker: Any) -> None:
        _evaluators.pop(self.token, None)


def _score_on_worker(token: str, config: dict[str, Any], floor: float | None) -> Score:
    return _evaluators[token].score(QuantConfig.from_dict(config), floor)


class DaskExecutor:
    """Scores on a Dask cluster's workers; a cluster that does not answer, or is lost, is one clear error."""

    def __init__(self, address: str, setup: EvalSetup):
        self.address = address
        self._log_levels = {name: logging.getLogger(name).level for name in DASK_LOGGERS}
        for name in DASK_LOGGERS:
            logging.getLogger(name).setLevel(logging.CRITICAL)
        try:
            self.client = Client(address, timeout=CONNECT_SECONDS, set_as_default=False)
        except (OSError, TimeoutError) as error:
            self._restore_logging()
            raise BuildError(f"the Dask scheduler at {address} does not answer within {CONNECT_SECONDS}s "
                             f"({error})") from None
        self.token = uuid.uuid4().hex
        plugin = EvaluatorPlugin(setup, self.token)
        try:
            self.client.register_plugin(plugin, name=plugin.name)
        except Exception as error:  # noqa: BLE001 - the cluster's own errors: one line, not its traceback
            self.close()
            raise BuildError(f"the Dask cluster at {address} could not take the evaluator ({error})") from None

    def score(self, configs: list[dict[str, Any]], floor: float | None) -> list[Score]:
        # No `retries`: those rerun a trial that raised, and a trial's own error is deterministic. A trial
        # whose worker died is rescheduled by the scheduler itself, up to its allowed-failures times.
        futures = [self.client.submit(_score_on_worker, self.token, config, floor, pure=False)
                   for config in configs]
        try:
            self._wait_while_workers_remain(futures)
            return list(self.client.gather(futures))
        except BuildError:
            raise
        except KilledWorker as error:
            raise BuildError(f"the Dask worker running a trial died {error.allowed_failures + 1} time(s) at "
                             f"{self.address} "
                             f"(the scheduler's distributed.scheduler.allowed-failures is {error.allowed_failures}); "
                             "the stage wrote nothing") from None
        except Exception as error:  # a lost scheduler surfaces as any of several errors
            if self.client.status != "running" or isinstance(error, OSError | TimeoutError):
                raise BuildError(f"lost the Dask scheduler at {self.address} mid-build; the stage wrote nothing"
                                 ) from None
            raise

    def _wait_while_workers_remain(self, futures: list[Future]) -> None:
        """Wait for the trials; a cluster left without a worker (every one died) stops the build, not hangs it."""
        workerless_since: float | None = None
        pending = list(futures)
        while pending:
            try:
                pending[0].result(timeout=1)  # a trial's error (KilledWorker) is raised here
                pending.pop(0)
                continue
            except TimeoutError:
                pass
            if self.client.nthreads():
                workerless_since = None
            elif workerless_since is None:
                workerless_since = time.monotonic()
            elif time.monotonic() - workerless_since > WORKERLESS_SECONDS:
                raise BuildError(f"the Dask cluster at {self.address} has had no workers for {WORKERLESS_SECONDS}s "
                                 "with trials to score; the stage wrote nothing")

    def close(self) -> None:
        with contextlib.suppress(Exception):  # a cluster already gone keeps nothing of ours
            self.client.unregister_worker_plugin(f"dabuild-evaluator-{self.token}")
        self.client.close(timeout=CONNECT_SECONDS)
        self._restore_logging()

    def _restore_logging(self) -> None:
        for name, level in self._log_levels.items():
            logging.getLogger(name).setLevel(level)
