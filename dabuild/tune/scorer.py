"""Scoring batches of configs: in this process, in `-j N` worker processes, or on a Dask cluster.

Worker processes are forked from the tune stage where the OS can (Linux,
macOS): each starts with the parent's Evaluator, whose weights, evaluation
images and float outputs the OS shares copy-on-write, so N workers do not
hold N copies of the model (the trace's weights are memory-mapped besides).
Where only spawning exists, each builds its own Evaluator from the same
EvalSetup and scores exactly as the parent would. Kept apart from
dabuild.tune.evaluate, which the Dask executor's workers import to score.
"""

from __future__ import annotations

import signal
import threading
import weakref
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from multiprocessing import get_all_start_methods, get_context
from typing import Any

from dabuild.ir.kernels.compiling import available_cores
from dabuild.limits import memory_budget
from dabuild.quant.config import QuantConfig
from dabuild.tune.evaluate import EvalSetup, Evaluator, Score

_worker: Evaluator | None = None


def _start_worker(source: Evaluator | EvalSetup, threads: int, budget: int | None) -> None:
    """The worker's Evaluator: the parent's own when forked, else built from its setup; its layers split
    among `threads` (its share of the cores), its batches within `budget` (its share of the memory)."""
    global _worker  # noqa: PLW0603 - the pool initializer sets the per-process evaluator
    if isinstance(source, EvalSetup):
        source = Evaluator(replace(source, threads=threads, budget=budget))
    source.threads = threads
    source.batch_size = source.samples_within(budget)
    _worker = source


def _score_in_worker(config: dict, floor: float | None) -> Score:
    assert _worker is not None
    return _worker.score(QuantConfig.from_dict(config), floor)


@contextmanager
def _interrupts_blocked() -> Iterator[None]:
    """SIGINT blocked in this thread meanwhile; processes started meanwhile inherit the mask for good.

    A Ctrl-C reaches the whole process group: without this, each worker would print its own
    KeyboardInterrupt traceback, even while still importing. The parent stops them (cli.main).
    """
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class Scorer:
    """Scores batches of configs, in this process or in `jobs` worker processes (forked where the OS can, see
    the module's docstring; the pool is made between trials, when no thread of this process holds a lock),
    or on the workers of the Dask cluster at `cluster` (dabuild/tune/executors.py)."""

    def __init__(self, evaluator: Evaluator, jobs: int = 1, cluster: str | None = None):
        self.evaluator = evaluator
        self.jobs = max(1, jobs)
        self._pool: ProcessPoolExecutor | None = None
        self._cluster: Any = None  # a DaskExecutor (dabuild/tune/dask_executor.py) when `cluster` is an address
        if cluster is not None:
            from dabuild.tune.dask_executor import DaskExecutor  # lazily: only a cluster needs dask

            self._cluster = DaskExecutor(cluster, evaluator.setup)
        _live.add(self)

    def score(self, configs: list[QuantConfig], floor: float | None = None) -> list[Score]:
        """Each config's score; `floor` lets hopeless ones stop early (see `Evaluator.score`)."""
        if self._cluster is not None:
            return self._cluster.score([config.to_dict() for config in configs], floor)
        if self.jobs == 1 or len(configs) < 2:
            return [self.evaluator.score(config, floor) for config in configs]
        if _stopping.is_set():  # interrupted: no new workers (the build is ending, see cli._interrupted)
            raise KeyboardInterrupt
        if self._pool is None:
            # each worker's layers split among its share of the cores and its batches within its share of the
            # evaluator's memory, so N workers neither oversubscribe the cores nor pass the budget together
            threads = max(1, available_cores() // self.jobs)
            budget = (self.evaluator.setup.budget or memory_budget()) // self.jobs
            forked = "fork" in get_all_start_methods()
            _ = self.evaluator.baseline  # made here once, before the fork: never once per worker
            source = self.evaluator if forked else self.evaluator.setup
            self._pool = ProcessPoolExecutor(self.jobs, mp_context=get_context("fork" if forked else "spawn"),
                                             initializer=_start_worker, initargs=(source, threads, budget))
        with _interrupts_blocked():  # workers start (on submit) deaf to Ctrl-C: the parent alone handles it
            futures = [self._pool.submit(_score_in_worker, config.to_dict(), floor) for config in configs]
        return [future.result() for future in futures]

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(cancel_futures=True)
        cluster, self._cluster = self._cluster, None
        if cluster is not None:
            cluster.close()

    def __enter__(self) -> Scorer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_live: weakref.WeakSet[Scorer] = weakref.WeakSet()
_stopping = threading.Event()


def stop_scoring() -> None:
    """Cancel what every live Scorer has queued and wait for its workers to finish their current trial and
    exit (on Ctrl-C: the workers ignore it, see `_interrupts_blocked`, so they end cleanly, not in tracebacks)."""
    _stopping.set()
    for scorer in list(_live):
        scorer.close()
