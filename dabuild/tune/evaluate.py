"""Scoring a quantization config: quantize, run dabuild's integer reference on the evaluation data, apply the metric.

The integer reference computes the bits an integer target will compute, so a
trial's score is the accuracy the deployed artifact delivers, not a float
simulation of it. `Evaluator` is built from plain, picklable `EvalSetup`
data, so worker processes (`-j N`) build their own from the same inputs and
score exactly as the parent would.
"""

from __future__ import annotations

import signal
import threading
import time
import weakref
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

import numpy as np

from dabuild.ir.graph import Graph
from dabuild.ir.interpreter import Interpreter
from dabuild.ir.kernels.native import available_cores
from dabuild.ir.memory import samples_that_fit
from dabuild.quant.calibrate import Stats
from dabuild.quant.config import QuantConfig
from dabuild.quant.qgraph import QGraph
from dabuild.quant.quantize import quantize
from dabuild.quant.reference import quantize_input, run_integer, run_quantized
from dabuild.tune.metric import Metric, load_metric

TRACED_BATCH = 8  # samples per batch when every intermediate is kept (a ResNet-50 image's take ~0.1 GB)


@dataclass(frozen=True)
class EvalSetup:
    """Everything a scoring process needs, as data."""

    graph_dir: Path
    stats_dir: Path
    x: np.ndarray
    labels: np.ndarray
    metric: str
    base_dir: Path | None
    batch_size: int
    bias_correction: bool = False
    metric_file: Path | None = None  # a file metric's .py as the tune stage declares it (else found from base_dir)


@dataclass(frozen=True)
class Score:
    metric: float
    mse: float  # output MSE against the float graph, relative to the float outputs' mean square
    seconds: float
    stopped: bool = False  # scoring stopped early: `metric` is an upper bound below the goal, mse of a part


def relative_mse(values: np.ndarray, reference: np.ndarray) -> float:
    reference = reference.astype(np.float64)
    power = float(np.mean(reference**2))
    return float(np.mean((values.astype(np.float64) - reference) ** 2)) / (power if power > 0 else 1.0)


class Evaluator:
    def __init__(self, setup: EvalSetup):
        self.setup = setup
        self.graph = Graph.load(setup.graph_dir)
        self.stats = Stats.load(setup.stats_dir)
        self.metric: Metric = load_metric(setup.metric, setup.base_dir, setup.metric_file)
        self.input = self.graph.inputs[0].name
        self.interpreter = Interpreter(self.graph, threads=available_cores())  # prepared once for every batch
        self.batch_size = samples_that_fit(self.graph, "tune", setup.batch_size)
        self.float_outputs = np.concatenate([self.interpreter.run({self.input: x})[self.graph.outputs[0]]
                                             for x in self._batches()])
        self.baseline = self.metric(self.float_outputs, setup.labels)

    def _batches(self, size: int | None = None) -> list[np.ndarray]:
        size = size or self.batch_size
        return [self.setup.x[i:i + size] for i in range(0, len(self.setup.x), size)]

    def quantize(self, config: QuantConfig) -> QGraph:
        """The graph lowered under `config`, as it is scored (and as the tune stage writes it)."""
        return quantize(self.graph, self.stats, config, self.setup.bias_correction)

    def score(self, config: QuantConfig, floor: float | None = None) -> Score:
        """The config's metric on the evaluation data; with `floor` (the least passing score) and a metric
        that is a mean over samples of 0 or 1 (accuracy, top_k), stopped after the first batch that
        leaves it unable to reach the floor.

        The bound: with c samples right of the s scored so far, the final score is at most
        (c + n - s) / n, reached only if every remaining sample is right. Once that is below the floor
        no remaining batch can make the config pass, so a hopeless config costs the batches it took to
        show it (the first, for a config far from the goal).
        """
        start = time.perf_counter()
        qgraph = self.quantize(config)
        bounded = floor is not None and self.metric.counts_samples
        parts: list[np.ndarray] = []
        right, scored, total = 0, 0, len(self.setup.x)
        for x in self._batches():
            parts.append(run_quantized(qgraph, x))
            if not bounded:
                continue
            labels = self.setup.labels[scored:scored + len(x)]
            right += round(self.metric(parts[-1], labels) * len(x))
            scored += len(x)
            bound = (right + total - scored) / total
            if scored < total and floor is not None and bound < floor:
                outputs = np.concatenate(parts)
                return Score(bound, relative_mse(outputs, self.float_outputs[:scored]), time.perf_counter() - start,
                             stopped=True)
        outputs = np.concatenate(parts)
        value = self.metric(outputs, self.setup.labels)
        return Score(value, relative_mse(outputs, self.float_outputs), time.perf_counter() - start)

    def subset(self, rows: int) -> np.ndarray:
        """`rows` evaluation rows spread evenly over the data (all of them if there are fewer)."""
        total = len(self.setup.x)
        return np.unique(np.linspace(0, total - 1, min(rows, total)).round().astype(np.int64))

    def subset_baseline(self, rows: np.ndarray) -> float:
        """The float graph's metric on the evaluation rows `rows`."""
        return self.metric(self.float_outputs[rows], self.setup.labels[rows])

    def subset_metric(self, config: QuantConfig, rows: np.ndarray) -> float:
        """The metric of `config` on the evaluation rows `rows` only: a cheap estimate for ranking, not a trial."""
        qgraph = self.quantize(config)
        x, size = self.setup.x[rows], self.setup.batch_size
        outputs = np.concatenate([run_quantized(qgraph, x[i:i + size]) for i in range(0, len(x), size)])
        return self.metric(outputs, self.setup.labels[rows])

    def node_errors(self, config: QuantConfig) -> dict[str, float]:
        """Per node, the relative MSE of its output under `config` against the float graph's.

        One run of each graph with every intermediate kept: how far quantization
        has pushed each node's output, the ranking the sensitivity-driven
        strategies fall back by, at the cost of one inference and no trial.
        Batches of at most TRACED_BATCH samples bound the memory every
        intermediate of both graphs takes.
        """
        qgraph = self.quantize(config)
        errors: dict[str, list[float]] = {}
        for x in self._batches(min(self.batch_size, TRACED_BATCH)):
            reference = self.interpreter.run({self.input: x}, keep_intermediates=True)
            quantized = run_integer(qgraph, quantize_input(qgraph, x), keep_intermediates=True)
            for node in self.graph.nodes:
                tensor = node.outputs[0]
                if tensor not in quantized or tensor not in reference:
                    continue
                value = quantized[tensor]
                if np.issubdtype(value.dtype, np.integer) and tensor in qgraph.tensors:
                    value = qgraph.tensors[tensor].params.dequantize(value)
                errors.setdefault(node.name, []).append(relative_mse(value, reference[tensor]) * len(x))
        return {name: float(sum(parts) / len(self.setup.x)) for name, parts in errors.items()}


_worker: Evaluator | None = None


def _start_worker(setup: EvalSetup) -> None:
    global _worker  # noqa: PLW0603 - the pool initializer sets the per-process evaluator
    _worker = Evaluator(setup)


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
    """Scores batches of configs, in this process or in `jobs` worker processes (spawned: no forked locks)."""

    def __init__(self, evaluator: Evaluator, jobs: int = 1):
        self.evaluator = evaluator
        self.jobs = max(1, jobs)
        self._pool: ProcessPoolExecutor | None = None
        _live.add(self)

    def score(self, configs: list[QuantConfig], floor: float | None = None) -> list[Score]:
        """Each config's score; `floor` lets hopeless ones stop early (see `Evaluator.score`)."""
        if self.jobs == 1 or len(configs) < 2:
            return [self.evaluator.score(config, floor) for config in configs]
        if _stopping.is_set():  # interrupted: no new workers (the build is ending, see cli._interrupted)
            raise KeyboardInterrupt
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.jobs, mp_context=get_context("spawn"),
                                             initializer=_start_worker, initargs=(self.evaluator.setup,))
        with _interrupts_blocked():  # workers start (on submit) deaf to Ctrl-C: the parent alone handles it
            futures = [self._pool.submit(_score_in_worker, config.to_dict(), floor) for config in configs]
        return [future.result() for future in futures]

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(cancel_futures=True)

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
