"""The Dask implementation of dabuild.tune.executors.TrialExecutor (see there for the design)."""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import replace
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from dabuild.cluster import Cluster
from dabuild.errors import BuildError
from dabuild.ir.memory import reuse_freed_arrays
from dabuild.quant.config import QuantConfig
from dabuild.tune.evaluate import EvalSetup, Evaluator, Score

_evaluators: dict[str, Evaluator] = {}  # in a Dask worker process: the evaluators its plugins built


class EvaluatorPlugin(WorkerPlugin):
    """Sent to each worker once: builds the worker's Evaluator from the setup."""

    def __init__(self, setup: EvalSetup, token: str):
        self.setup_data = setup
        self.token = token
        self.name = f"dabuild-evaluator-{token}"

    def setup(self, worker: Any) -> None:
        reuse_freed_arrays()  # the nanny's MALLOC_TRIM_THRESHOLD_ would make every big array an mmap
        _evaluators[self.token] = Evaluator(replace(self.setup_data, threads=1))  # one trial per worker thread

    def teardown(self, worker: Any) -> None:
        _evaluators.pop(self.token, None)


def _score_on_worker(token: str, config: dict[str, Any], floor: float | None) -> Score:
    return _evaluators[token].score(QuantConfig.from_dict(config), floor)


class DaskExecutor:
    """Scores on a Dask cluster's workers; a cluster that does not answer, or is lost, is one clear error."""

    def __init__(self, address: str, setup: EvalSetup):
        self.address = address
        self.cluster = Cluster(address, "a trial", "trials to score")
        self.client = self.cluster.client
        self.token = uuid.uuid4().hex
        plugin = EvaluatorPlugin(setup, self.token)
        try:
            self.client.register_plugin(plugin, name=plugin.name)
        except Exception as error:  # noqa: BLE001 - the cluster's own errors: one line, not its traceback
            self.close()
            raise BuildError(f"the Dask cluster at {address} could not take the evaluator ({error})") from None

    def score(self, configs: list[dict[str, Any]], floor: float | None) -> list[Score]:
        futures = [self.client.submit(_score_on_worker, self.token, config, floor, pure=False)
                   for config in configs]
        return self.cluster.gather(futures)

    def close(self) -> None:
        with contextlib.suppress(Exception):  # a cluster already gone keeps nothing of ours
            self.client.unregister_worker_plugin(f"dabuild-evaluator-{self.token}")
        self.cluster.close()
