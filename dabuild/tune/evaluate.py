"""Scoring a quantization config: quantize, run dabuild's integer reference on the evaluation data, apply the metric.

The integer reference computes the bits an integer target will compute, so a
trial's score is the accuracy the deployed artifact delivers, not a float
simulation of it. `Evaluator` is built from plain, picklable `EvalSetup`
data, so worker processes and Dask workers (dabuild.tune.scorer) can build
their own.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dabuild.ir.graph import Graph
from dabuild.ir.interpreter import Interpreter
from dabuild.ir.kernels.compiling import available_cores
from dabuild.ir.kernels.forking import forget_pool_after_fork
from dabuild.ir.kernels.native import layer_threads
from dabuild.ir.memory import kept_sample_bytes, samples_that_fit
from dabuild.metrics import top_k_of
from dabuild.qir.qgraph import QGraph
from dabuild.qir.reference import dequantize_output, quantize_input, run_integer, run_quantized
from dabuild.quant.calibrate import Stats
from dabuild.quant.config import QuantConfig
from dabuild.quant.lowering import WeightCache
from dabuild.quant.node_memo import NodeLowerings
from dabuild.quant.quantize import quantize
from dabuild.tune.metric import Metric, load_metric

# Bytes of intermediates the traced pass keeps per batch at most (`kept_sample_bytes` a sample; at least one
# sample). A ResNet-50 image keeps 89 MB by that count, ~60 MB of RSS measured: 2 images a batch. Its tune stage
# peaked at 0.98 GB RSS with 8 images a batch, 0.63 GB with 2, the pass no slower (two tune stages of -j 8 each
# took 1.1 GB of a 2 GB budget with 8); a small model's batches stay large, each run's Python being its cost.
# Each sample's values do not depend on the batch.
TRACED_BYTES = 192 << 20


@dataclass(frozen=True)
class EvalSetup:
    """Everything a scoring process needs, as data."""

    graph_dir: Path
    stats_dir: Path
    x: np.ndarray
    labels: np.ndarray
    metric: str
    batch_size: int
    bias_correction: bool = False
    metric_file: Path | None = None  # a file metric's .py as the tune stage declares it (else the path the metric writes)
    threads: int = 0  # threads a large layer of the integer reference splits among (0: every core)
    integer_writers: frozenset[str] = frozenset()  # dense/convs whose output an island dequantizes (space.py)
    budget: int | None = None  # bytes this evaluator's batches may use (None: the whole memory budget)


@dataclass(frozen=True)
class Score:
    metric: float
    mse: float  # output MSE against the float graph, relative to the float outputs' mean square
    seconds: float
    stopped: bool = False  # scoring stopped early: `metric` is an upper bound below the goal, mse of a part


def relative_mse(values: np.ndarray, reference: np.ndarray) -> float:
    """The mean square of `values - reference` over that of `reference`, in float64.

    Where both lie alike in memory (the same shape, type and layout: a node's output as the integer and the float
    run leave it), each square is made in one pass from the float32 arrays, converting as it goes: the same
    float64 arrays, laid out and summed alike, as converting both whole first makes (the bits are equal),
    in two passes and two temporaries fewer."""
    if values.dtype == reference.dtype and _same_layout(values, reference):
        squares = np.empty_like(reference, dtype=np.float64)  # laid out as np.square would make it: summed alike
        errors = np.empty_like(reference, dtype=np.float64)
        parts = _row_parts(len(reference) if reference.ndim else 0, reference.size)
        if len(parts) > 1:
            pool = _SQUARES.get()
            others = [pool.submit(_squares_of, values[part], reference[part], squares[part], errors[part])
                      for part in parts[1:]]
            _squares_of(values[parts[0]], reference[parts[0]], squares[parts[0]], errors[parts[0]])
            for other in others:
                other.result()
        else:
            _squares_of(values, reference, squares, errors)
    else:
        reference = reference.astype(np.float64)
        squares = reference**2
        errors = (values.astype(np.float64) - reference) ** 2
    power = float(np.mean(squares))
    return float(np.mean(errors)) / (power if power > 0 else 1.0)


SQUARE_SPLIT = 1 << 18  # elements from which relative_mse's squares are made on two threads (numpy frees the GIL)


def _squares_of(values: np.ndarray, reference: np.ndarray, squares: np.ndarray, errors: np.ndarray) -> None:
    """Fill `squares` with `reference`'s and `errors` with `values - reference`'s, each element in float64."""
    np.square(reference, out=squares, dtype=np.float64)
    np.subtract(values, reference, out=errors, dtype=np.float64)
    np.square(errors, out=errors)


def _row_parts(rows: int, size: int) -> list[slice]:
    """Halves of the first axis for arrays of at least SQUARE_SPLIT elements and two rows, else the whole.

    Each element's square is the same whichever thread makes it, and the means still sum the whole arrays in
    one call, so the result's bits are those of one thread's."""
    if size < SQUARE_SPLIT or rows < 2:
        return [slice(None)]
    return [slice(0, rows // 2), slice(rows // 2, rows)]


class _SquarePool:
    """The thread that makes the second half of relative_mse's squares while the caller makes the first (a
    forked trial worker forgets it and starts its own)."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        forget_pool_after_fork(self)

    def get(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="dabuild-squares")
        return self._pool


_SQUARES = _SquarePool()


def _same_layout(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether `a` and `b` have one shape and lie alike in memory (the strides of axes of one element aside)."""
    return a.shape == b.shape and all(size == 1 or s == t for size, s, t in zip(a.shape, a.strides, b.strides))


class Evaluator:
    def __init__(self, setup: EvalSetup):
        self.setup = setup
        self.graph = Graph.load(setup.graph_dir)
        self.stats = Stats.load(setup.stats_dir)
        self.metric: Metric = load_metric(setup.metric, setup.metric_file)
        self.input = self.graph.inputs[0].name
        self.threads = setup.threads or available_cores()
        self.interpreter = Interpreter(self.graph, threads=self.threads)  # prepared once for every batch
        self.weight_cache = WeightCache()  # each node's integer (and packed) weights, while its choice stays
        self.batch_size = self.samples_within(setup.budget)
        self._traced: Traced | None = None  # the last config `trace` ran over every row

    @functools.cached_property
    def float_outputs(self) -> np.ndarray:
        """The float graph's outputs on every evaluation row, which each score's MSE compares against: from
        the float pass `trace` made where it ran first, else one batched pass now."""
        return np.concatenate([self.interpreter.run({self.input: x})[self.graph.outputs[0]] for x in self._batches()])

    @functools.cached_property
    def baseline(self) -> float:
        """The float graph's metric on the evaluation data: the score each config's is held against."""
        return self.metric(self.float_outputs, self.setup.labels)

    def samples_within(self, budget: int | None) -> int:
        """The batch size that keeps this evaluator within `budget` bytes (None: the whole memory budget)."""
        return samples_that_fit(self.graph, "tune", self.setup.batch_size, self.setup.x.nbytes, "evaluation data",
                                budget)

    def _batches(self, size: int | None = None) -> list[np.ndarray]:
        size = size or self.batch_size
        return [self.setup.x[i:i + size] for i in range(0, len(self.setup.x), size)]

    def quantize(self, config: QuantConfig) -> QGraph:
        """The graph lowered under `config`, as it is scored (and as the tune stage writes it)."""
        return quantize(self.graph, self.stats, config, self.setup.bias_correction, self.weight_cache,
                        self.setup.integer_writers)

    def priced(self, config: QuantConfig) -> QGraph:
        """The graph lowered under `config` for measuring it (its size, a cost model's estimate, whether its
        artifact fits): the same layers as `quantize`'s, each node's remembered from an earlier config that
        lowered it alike (`NodeLowerings`) and shared with that config's graph, so never to be changed."""
        return quantize(self.graph, self.stats, config, self.setup.bias_correction, self._pricing_weights,
                        self.setup.integer_writers, self.node_lowerings)

    @functools.cached_property
    def node_lowerings(self) -> NodeLowerings:
        """Lowered nodes, holding at most the float graph's constant bytes of arrays (int8 layers of about four
        whole configs): the memory one more evaluation batch of a large model takes."""
        return NodeLowerings(sum(np.asarray(values).nbytes for values in self.graph.constants.values()))

    @functools.cached_property
    def _pricing_weights(self) -> WeightCache:
        """The weights the nodes `priced` lowers were last lowered with: its own, so pricing a config never
        turns the trials' cache (and the packed weights it keeps for the integer kernels) to another choice."""
        return WeightCache()

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
        traced = self._traced if self._traced is not None and self._traced.config == config else None
        if traced is not None:  # its integer pass is done: its seconds are the trial's
            start -= traced.seconds
        bounded = floor is not None and self.metric.counts_samples
        parts: list[np.ndarray] = []
        right, scored, total = 0, 0, len(self.setup.x)
        for y in self._outputs(config, traced):
            parts.append(y)
            if not bounded:
                continue
            labels = self.setup.labels[scored:scored + len(y)]
            right += round(self.metric(y, labels) * len(y))
            scored += len(y)
            bound = (right + total - scored) / total
            if scored < total and floor is not None and bound < floor:
                outputs = np.concatenate(parts)
                return Score(bound, relative_mse(outputs, self.float_outputs[:scored]), time.perf_counter() - start,
                             stopped=True)
        outputs = np.concatenate(parts)
        value = self.metric(outputs, self.setup.labels)
        return Score(value, relative_mse(outputs, self.float_outputs), time.perf_counter() - start)

    def _outputs(self, config: QuantConfig, traced: Traced | None) -> Iterator[np.ndarray]:
        """The integer graph's outputs under `config`, batch by batch: the traced pass's (`traced`, that
        config's), cut into this evaluator's batches, else each batch run as it is asked for."""
        if traced is not None:
            yield from (traced.outputs[i:i + self.batch_size] for i in range(0, len(traced.outputs), self.batch_size))
            return
        qgraph = self.quantize(config)
        for x in self._batches():
            with layer_threads(self.threads):
                yield run_quantized(qgraph, x)

    @property
    def subset_is_marginal(self) -> bool:
        """Whether `subset` is stratified by the float model's margins: for accuracy and top-k over (samples,
        classes) outputs, metrics that count each sample's verdict."""
        outputs = self.float_outputs
        return self.metric.counts_samples and outputs.ndim == 2 and outputs.shape[1] > self._k

    @property
    def _k(self) -> int:
        return top_k_of(self.metric.name) or 1

    def _nearest(self, count: int) -> np.ndarray:
        """The `count` rows whose float k-th and (k+1)-th largest outputs are closest."""
        ordered = np.sort(self.float_outputs, axis=1)
        margin = ordered[:, -self._k] - ordered[:, -self._k - 1]
        return np.argsort(margin, kind="stable")[:count]

    def subset(self, rows: int) -> np.ndarray:
        """`rows` evaluation rows in index order (all of them if there are fewer).

        Marginal (`subset_is_marginal`): two thirds are the rows nearest the float model's decisions (its
        k-th and (k+1)-th largest outputs closest), the only rows a small quantization error can move across
        the metric's verdict; the last third is spread evenly over the other rows, so a config far off, which
        flips rows anywhere, is seen too (`subset_metric` weighs each stratum by its share of the data). On
        bench/hard_cases.py's int4 case the 100 nearest of 1,000 rows held every flip of every config one
        move from the cheapest; 300 rows spread evenly saw 2 of its cheapest config's 10. The float outputs
        are the baseline's pass, already made. Otherwise: rows spread evenly over the data.
        """
        total = len(self.setup.x)
        if rows >= total:
            return np.arange(total)
        if not self.subset_is_marginal:
            return np.unique(np.linspace(0, total - 1, rows).round().astype(np.int64))
        near = self._nearest(rows * 2 // 3)
        rest = np.setdiff1d(np.arange(total), near)
        spread = rest[np.unique(np.linspace(0, len(rest) - 1, rows - len(near)).round().astype(np.int64))]
        return np.sort(np.concatenate([near, spread]))

    def subset_baseline(self, rows: np.ndarray) -> float:
        """The float graph's metric on the evaluation rows `rows`."""
        return self.metric(self.float_outputs[rows], self.setup.labels[rows])

    def subset_metric(self, config: QuantConfig, rows: np.ndarray) -> float:
        """A cheap estimate of `config`'s metric, not a trial: its metric on the evaluation rows `rows`; on a
        marginal subset (`subset` with as many rows), the whole set's metric as the two strata estimate it:
        the float baseline plus what the config changes against float on each stratum's rows, the nearest
        rows counted once, each spread row for its share of the rows not nearest."""
        qgraph = self.quantize(config)
        x, size = self.setup.x[rows], self.setup.batch_size
        with layer_threads(self.threads):
            outputs = np.concatenate([run_quantized(qgraph, x[i:i + size]) for i in range(0, len(x), size)])
        labels = self.setup.labels[rows]
        if not self.subset_is_marginal or len(rows) >= len(self.setup.x):
            return self.metric(outputs, labels)
        changes = np.array([self.metric(outputs[i:i + 1], labels[i:i + 1])
                            - self.metric(self.float_outputs[row:row + 1], labels[i:i + 1])
                            for i, row in enumerate(rows)])
        near = np.isin(rows, self._nearest(len(rows) * 2 // 3))
        total = len(self.setup.x)
        weights = np.where(near, 1.0, (total - near.sum()) / max(1, (~near).sum()))
        return self.baseline + float(np.sum(weights * changes)) / total

    def node_errors(self, config: QuantConfig, rows: np.ndarray | None = None) -> dict[str, float]:
        """Per node, the relative MSE of its output under `config` against the float graph's, on the
        evaluation rows `rows` (None: all of them, the pass `trace` makes once per config).

        One run of each graph: how far quantization has pushed each node's
        output, the ranking the sensitivity-driven strategies fall back by (and
        the tuning report's table), at the cost of one inference and no trial.
        The integer run keeps its (compact, integer) intermediates; the float
        run compares each node's output as it appears and frees it after its
        last reader, so a batch (TRACED_BYTES) holds the integer
        intermediates and the float tensors alive at one node, not every float
        intermediate.
        """
        if rows is None:
            return self.trace(config).errors
        return self._traced_pass(config, self.setup.x[rows]).errors

    def trace(self, config: QuantConfig) -> Traced:
        """`node_errors` of `config` over every row, with both graphs' outputs, made once (the last config's
        pass is kept).

        Over every row the two runs are whole passes of each graph: the float outputs become `float_outputs`
        where no pass made them yet, and the integer outputs are what `score` reads for `config` instead of
        running its graph again. The tune stage's report needs the default config's errors over every row, so
        tracing it before the search spares that stage a float pass and its first trial's integer pass. (The
        interpreter computes each sample alike in a batch of any size, as the smaller batches of -j's trial
        workers already rely on: these float outputs are the batched pass's.)
        """
        if self._traced is None or self._traced.config != config:
            self._traced = self._traced_pass(config, self.setup.x)
            self.__dict__.setdefault("float_outputs", self._traced.float_outputs)
        return self._traced

    @functools.cached_property
    def _traced_batch(self) -> int:
        """Samples a traced pass runs at once: as many as keep TRACED_BYTES of intermediates (at least one), within
        this evaluator's batch."""
        return max(1, min(self.batch_size, TRACED_BYTES // max(1, kept_sample_bytes(self.graph))))

    def _traced_pass(self, config: QuantConfig, data: np.ndarray) -> Traced:
        """`node_errors` on the rows `data`, with both graphs' outputs and the seconds the integer run took."""
        qgraph = self.quantize(config)
        errors: dict[str, list[float]] = {node.name: [] for node in self.graph.nodes}
        producer = {node.outputs[0]: node.name for node in self.graph.nodes}
        size = self._traced_batch
        outputs, float_outputs, seconds = [], [], 0.0
        for x in (data[i:i + size] for i in range(0, len(data), size)):
            start = time.perf_counter()
            with layer_threads(self.threads):  # outputs only: the compiled layers run, keeping no accumulator
                quantized = run_integer(qgraph, quantize_input(qgraph, x), keep_intermediates=True,
                                        accumulators=False)
            outputs.append(dequantize_output(qgraph, quantized[qgraph.output]))
            seconds += time.perf_counter() - start
            compare = functools.partial(_add_node_error, errors, producer, qgraph, quantized, len(x))
            float_outputs.append(self.interpreter.run({self.input: x}, visit=compare)[self.graph.outputs[0]])
        return Traced(config, {name: float(sum(parts) / len(data)) for name, parts in errors.items() if parts},
                      np.concatenate(outputs), np.concatenate(float_outputs), seconds)


@dataclass(frozen=True)
class Traced:
    """One traced pass (`Evaluator.trace`): a config's per-node errors against the float graph, both graphs'
    outputs on the rows it ran, and the seconds its integer run took (a trial's work)."""

    config: QuantConfig
    errors: dict[str, float]
    outputs: np.ndarray
    float_outputs: np.ndarray
    seconds: float


def _add_node_error(errors: dict[str, list[float]], producer: dict[str, str], qgraph: QGraph,
                    quantized: dict[str, np.ndarray], count: int, tensor: str, reference: np.ndarray) -> None:
    """Append the error of the integer run's `tensor` against the float run's (`reference`, as the interpreter
    visits it) to its producer's list, weighted by the `count` samples of the batch."""
    if tensor not in producer or tensor not in quantized:
        return
    value = quantized[tensor]
    if np.issubdtype(value.dtype, np.integer) and tensor in qgraph.tensors:
        value = qgraph.tensors[tensor].params.dequantize(value)
    errors[producer[tensor]].append(relative_mse(value, reference) * count)
