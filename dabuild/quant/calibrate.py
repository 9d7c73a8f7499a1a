"""Calibration: one streaming pass of the data through the float graph, kept as histograms.

For the graph inputs and every node output, `Stats` keeps the exact min/max
and a fixed-size histogram, once for the whole tensor and once per channel.
Every calibration algorithm (minmax, percentile, entropy, mse; see
`algorithms`) derives its range from these, so trying another algorithm never
re-runs the model, and memory is bounded by the histograms: no activation
outlives its batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from dabuild.errors import BuildError
from dabuild.ir.graph import Graph, Node
from dabuild.ir.interpreter import Interpreter
from dabuild.ir.kernels.compiling import available_cores
from dabuild.ir.kernels.native import native_histogram
from dabuild.ir.memory import arrays_reused_in_heap, samples_that_fit
from dabuild.ir.npz import read_npz, write_npz
from dabuild.progress import Progress
from dabuild.qir.activations import is_table_activation, pre_activation
from dabuild.qir.dtypes import int_type
from dabuild.quant.algorithms import ALGORITHMS, Levels, Range
from dabuild.quant.histogram import BINS, Bins, Histogram

STATS_FILE = "stats.npz"
_RANGE = "range"
_AXIS = "axis"
_HISTOGRAM_FIELDS = ("counts", "width", "offset", "low", "high")
# Ops whose output features lie on the last axis, (batch, ..., features); others use axis 1 (NCHW).
LAST_AXIS_OPS = frozenset({"dense", "matmul", "embedding"})
FUSING_OPS = frozenset({"dense", "conv"})  # ops whose fused table activation calibration splits off


@dataclass(eq=False)
class TensorStats:
    """One tensor's histograms: of all its values, and (unless `channels` is None) of each slice along its
    channel axis."""

    axis: int | None
    whole: Histogram
    channels: Histogram | None

    @classmethod
    def start(cls, values: np.ndarray, axis: int | None, per_channel: bool = True) -> TensorStats:
        """Empty histograms sized for `values`; a negative axis counts from the end, as in numpy."""
        if axis is not None:
            axis %= values.ndim
        channels = 1 if axis is None else values.shape[axis]
        return cls(axis, Histogram.empty(1), Histogram.empty(channels, narrow=True) if per_channel else None)

    def observe(self, values: np.ndarray) -> int:
        """Count one batch of values; the number of NaN or infinite values instead, counting nothing, if any."""
        if self.channels is None:
            return self._observe_whole(values)
        return self._observe_channels(values, self.channels)

    def _observe_whole(self, values: np.ndarray) -> int:
        """The whole-tensor histogram alone: counted by the native kernel in memory order, in one pass that also
        takes the extremes (`NativeHistogram.whole`) while the batch stays within the window; a batch with
        values past it has the window widened and only those values counted in a second pass. The first batch
        (no window yet) takes its extremes first. numpy (`Histogram.add`) counts the same."""
        native = native_histogram() if values.dtype == np.float32 else None
        if native is None:
            finite = np.isfinite(values)
            if not finite.all():
                return int(finite.size - finite.sum())
            self.whole.add(values.reshape(1, -1))
            return 0
        flat = np.ascontiguousarray(values.ravel(order="K"))  # memory order: no copy wherever the layout is dense
        whole = self.whole
        if whole.width[0] > 0:  # count what the window takes; `left` values lie past it
            skip = whole.window(0)
            low, high, bad, left = native.whole(flat, float(whole.reciprocals()[0]), int(whole.offset[0]),
                                                whole.counts[0])
        else:  # no window yet: the extremes first, then every value
            skip = (np.inf, -np.inf)
            low, high, bad, left = (*native.whole(flat, 0.0, 0, None)[:3], flat.size)
        if bad:
            return bad
        whole.extend(np.array([low]), np.array([high]))
        if left:
            native.whole(flat, float(whole.reciprocals()[0]), int(whole.offset[0]), whole.counts[0], skip)
        return 0

    def _observe_channels(self, values: np.ndarray, channels: Histogram) -> int:
        """Per-channel and whole-tensor histograms.

        A float32 tensor is counted by the native kernel (dabuild.ir.kernels.histogram.c) where one is built,
        in place in whatever memory order the interpreter left it (channels last in tiles of channels whose
        tables stay in cache): one pass for the extremes, one that bins each value into the per-channel and
        the whole-tensor histogram. It counts exactly what the numpy
        path (`Histogram.add`) counts.

        The per-channel rows are int32 (the whole-tensor row, int64, says how many values each channel has
        counted) until a channel could pass 2^31 - 1 values; then they widen to int64 and count in numpy.
        """
        count = channels.channels
        channels.make_room(int(self.whole.counts.sum()) // count, values.size // count)
        native = native_histogram() if values.dtype == np.float32 and channels.counts.dtype == np.int32 else None
        if native is None:
            finite = np.isfinite(values)
            if not finite.all():
                return int(finite.size - finite.sum())
            self.whole.add(values.reshape(1, -1))
            by_channel = values.reshape(1, -1) if self.axis is None else np.moveaxis(values, self.axis, 0)
            channels.add(by_channel.reshape(count, -1))
            return 0
        view, _memory = native.view(values, self.axis)
        lows, highs, bad = native.extremes(view)
        if bad:
            return bad
        channels.extend(lows, highs)
        self.whole.extend(lows.min(keepdims=True), highs.max(keepdims=True))
        native.count(view, channels.reciprocals(), channels.offset, channels.counts,
                     float(self.whole.reciprocals()[0]), int(self.whole.offset[0]), self.whole.counts[0])
        return 0

    __hash__ = None  # type: ignore[assignment]  # mutable and compared by value: unhashable, as with no __hash__

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TensorStats):
            return NotImplemented
        return (self.axis, self.whole, self.channels) == (other.axis, other.whole, other.channels)


def _levels(scheme: str, dtype: str) -> Levels:
    integer = int_type(dtype)
    if scheme not in ("sym", "asym"):
        raise BuildError(f"calibration: unknown scheme {scheme!r} (known: sym, asym)")
    return Levels(integer.qmin, integer.qmax, scheme)


def _derive(bins: Bins, algorithm: str, levels: Levels, tensor: str, params: dict[str, Any]) -> Range:
    if algorithm not in ALGORITHMS:
        raise BuildError(f"tensor {tensor!r}: unknown calibration algorithm {algorithm!r} "
                         f"(known: {', '.join(ALGORITHMS)})")
    try:
        low, high = ALGORITHMS[algorithm](bins, levels, **params)
    except (TypeError, ValueError) as error:
        raise BuildError(f"tensor {tensor!r}: calibration algorithm {algorithm!r}: {error}") from None
    return float(low), float(high)


@dataclass
class Stats:
    """Calibration statistics: `ranges` holds each tensor's exact (min, max); `tensors` its histograms.

    Stats built from ranges alone (hand-picked, or saved before histograms
    existed) serve minmax only. With `per_channel` False, tensors keep their whole-tensor histogram alone
    (what activations' quantization reads; the per-channel ones serve bias correction's channel means).
    """

    ranges: dict[str, tuple[float, float]] = field(default_factory=dict)
    tensors: dict[str, TensorStats] = field(default_factory=dict)
    per_channel: bool = True
    _derived: dict[tuple, Any] = field(default_factory=dict, compare=False, repr=False)

    def observe(self, name: str, values: np.ndarray, axis: int | None = None, where: str | None = None) -> None:
        """Add one batch of tensor `name`; `axis` is its channel axis (fixed by the first batch)."""
        values = np.asarray(values)
        if values.size == 0:
            return
        if name not in self.tensors:
            self.tensors[name] = TensorStats.start(values, axis, self.per_channel)
        bad = self.tensors[name].observe(values)
        if bad:
            raise BuildError(f"calibration: {where or f'tensor {name!r}'} holds {bad} NaN or infinite values")
        whole = self.tensors[name].whole
        self.ranges[name] = (float(whole.low[0]), float(whole.high[0]))
        self._derived.clear()

    def channel_axis(self, tensor: str) -> int | None:
        return self._tensor(tensor).axis

    def range(self, tensor: str, algorithm: str = "minmax", scheme: str = "asym", dtype: str = "int8",
              **params: Any) -> Range:
        """The (low, high) that `algorithm` picks for the whole tensor; (-t, t) for the sym scheme."""
        key = ("tensor", tensor, algorithm, scheme, dtype, tuple(sorted(params.items())))
        if key not in self._derived:
            levels = _levels(scheme, dtype)
            if tensor not in self.tensors and algorithm == "minmax" and tensor in self.ranges:
                low, high = self.ranges[tensor]
                bins = Bins(np.ones(1, dtype=np.int64), 0, 0.0, low, high)
            else:
                bins = self._tensor(tensor).whole.bins(0)
            self._derived[key] = _derive(bins, algorithm, levels, tensor, params)
        return self._derived[key]

    def channel_ranges(self, tensor: str, algorithm: str = "minmax", scheme: str = "asym", dtype: str = "int8",
                       **params: Any) -> tuple[np.ndarray, np.ndarray]:
        """Per-channel (lows, highs) along `channel_axis(tensor)`, each channel calibrated on its own."""
        key = ("channel", tensor, algorithm, scheme, dtype, tuple(sorted(params.items())))
        if key not in self._derived:
            levels = _levels(scheme, dtype)
            histogram = self._channels(tensor)
            pairs = [_derive(histogram.bins(c), algorithm, levels, tensor, params) for c in range(histogram.channels)]
            self._derived[key] = (np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs]))
        lows, highs = self._derived[key]
        return lows.copy(), highs.copy()

    def channel_means(self, tensor: str) -> np.ndarray:
        """Per-channel means along `channel_axis(tensor)`, read off the histograms (nothing more is stored)."""
        key = ("mean", tensor)
        if key not in self._derived:
            histogram = self._channels(tensor)
            self._derived[key] = np.array([histogram.bins(c).mean() for c in range(histogram.channels)])
        return self._derived[key].copy()

    def _tensor(self, tensor: str) -> TensorStats:
        if tensor not in self.tensors:
            if tensor in self.ranges:
                raise BuildError(f"tensor {tensor!r}: the calibration statistics hold only its min/max, no "
                                 "histogram; recalibrate")
            raise BuildError(f"no calibration statistics for tensor {tensor!r}; recalibrate with this graph")
        return self.tensors[tensor]

    def _channels(self, tensor: str) -> Histogram:
        channels = self._tensor(tensor).channels
        if channels is None:
            raise BuildError(f"tensor {tensor!r}: calibration kept its whole-tensor histogram only (per-channel "
                             "ones are kept when tuning.bias_correction is on); recalibrate with it on")
        return channels

    def save(self, directory: Path) -> None:
        """Write stats.npz: fixed-size arrays only, so its size does not depend on the number of samples."""
        arrays = {f"{_RANGE}/{name}": np.array(r, dtype=np.float64) for name, r in self.ranges.items()}
        for name, stats in self.tensors.items():
            arrays[f"{_AXIS}/{name}"] = np.array([-1 if stats.axis is None else stats.axis], dtype=np.int64)
            for part in ("whole", "channels"):
                histogram = getattr(stats, part)
                if histogram is None:
                    continue
                for key in _HISTOGRAM_FIELDS:
                    arrays[f"{part}.{key}/{name}"] = getattr(histogram, key)
        Path(directory).mkdir(parents=True, exist_ok=True)
        write_npz(Path(directory) / STATS_FILE, arrays)

    @classmethod
    def load(cls, directory: Path) -> Stats:
        grouped: dict[str, dict[str, np.ndarray]] = {}
        for key, array in read_npz(Path(directory) / STATS_FILE, mapped=True).items():
            kind, _, name = key.partition("/")
            grouped.setdefault(kind, {})[name] = array
        ranges = {name: (float(a[0]), float(a[1])) for name, a in sorted(grouped.get(_RANGE, {}).items())}
        tensors = {}
        for name, axis in sorted(grouped.get(_AXIS, {}).items()):
            whole, channels = (Histogram(*(grouped[f"{part}.{key}"][name] for key in _HISTOGRAM_FIELDS))
                               if name in grouped.get(f"{part}.counts", {}) else None for part in ("whole", "channels"))
            if whole is None:
                raise BuildError(f"{Path(directory) / STATS_FILE}: tensor {name!r} has no whole-tensor histogram; "
                                 "recalibrate")
            tensors[name] = TensorStats(None if axis[0] < 0 else int(axis[0]), whole, channels)
        return cls(ranges, tensors, all(stats.channels is not None for stats in tensors.values()))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able view for reports."""
        return {"ranges": {name: [lo, hi] for name, (lo, hi) in sorted(self.ranges.items())},
                "channel_axes": {name: stats.axis for name, stats in sorted(self.tensors.items())}}


def observed_tensors(graph: Graph) -> list[str]:
    """The tensors whose ranges quantization needs: graph inputs (but integer ones, never quantized) and node
    outputs."""
    integer = set(graph.integer_inputs())
    return ([spec.name for spec in graph.inputs if spec.name not in integer]
            + [out for node in graph.nodes for out in node.outputs])


def histogram_bytes(graph: Graph, per_channel: bool = True) -> int:
    """The bytes calibration's histograms of `graph` take: BINS int64 counts per observed tensor as a whole,
    and with `per_channel` BINS int32 ones per channel of each (held for the whole stage, whatever the batch
    size)."""
    specs = graph.tensor_shapes()
    shapes = {name: tuple(1 if d is None else d for d in spec.shape) for name, spec in specs.items()}
    axes = channel_axes(graph, shapes)
    channels = sum(1 if axis is None else shapes[name][axis] for name, axis in axes.items()) if per_channel else 0
    return BINS * (channels * np.dtype(np.int32).itemsize + len(axes) * np.dtype(np.int64).itemsize)


def channel_axes(graph: Graph, shapes: dict[str, tuple[int, ...]]) -> dict[str, int | None]:
    """Each observed tensor's channel axis, from its producer and its shape (see `ChannelAxes`)."""
    axes = ChannelAxes(graph)
    return {name: axes(name, shapes) for name in observed_tensors(graph)}


class ChannelAxes:
    """The channel axis of each observed tensor, from its producer and its shape, one tensor at a time in graph
    order (so a calibration pass can ask as each tensor appears).

    dense/matmul outputs: the last axis (features). A shape-preserving op (relu,
    add, ...) keeps its input's axis. Anything else of rank >= 2: axis 1
    (NCHW). A graph input feeding a dense/matmul first: the last axis. Rank < 2:
    no channels.
    """

    def __init__(self, graph: Graph):
        self.consumers = graph.consumers()
        self.producers = {out: node for node in graph.nodes for out in node.outputs}
        self.axes: dict[str, int | None] = {}

    def __call__(self, name: str, shapes: dict[str, tuple[int, ...]]) -> int | None:
        """The axis of `name`, whose shape and whose producer's inputs' shapes are in `shapes`."""
        if name in self.axes:
            return self.axes[name]
        rank = len(shapes[name])
        default = None if rank < 2 else 1
        node = self.producers.get(name)
        if node is None:  # a graph input
            first = self.consumers.get(name, [])
            axis = rank - 1 if rank >= 2 and first and first[0].op in LAST_AXIS_OPS else default
        elif node.op in LAST_AXIS_OPS:
            axis = rank - 1 if rank >= 2 else None
        else:
            source = next((input_name for input_name in node.inputs if input_name in self.axes), None)
            same = source is not None and tuple(shapes[source][1:]) == tuple(shapes[name][1:])
            axis = self.axes[source] if source is not None and same else default
        self.axes[name] = axis
        return axis


def with_table_activations_split(graph: Graph) -> Graph:
    """The same graph, with each table activation fused into conv/dense moved into a node of its own.

    The new node reads `pre_activation(output)` and writes the original output,
    so every tensor of `graph` keeps its name and its values.
    """
    nodes: list[Node] = []
    for node in graph.nodes:
        activation = node.attrs.get("activation", "none")
        if node.op not in FUSING_OPS or not is_table_activation(activation):
            nodes.append(node)
            continue
        output = node.outputs[0]
        attrs = {**node.attrs, "activation": "none", "activation_attrs": {}}
        nodes.append(replace(node, outputs=[pre_activation(output)], attrs=attrs))
        nodes.append(Node(f"{node.name}:{activation}", activation, [pre_activation(output)], [output],
                          dict(node.attrs.get("activation_attrs", {}))))
    return Graph(graph.inputs, graph.outputs, nodes, graph.constants)


def _describe(graph: Graph) -> dict[str, str]:
    """How error messages name each observed tensor."""
    names = {spec.name: f"graph input {spec.name!r}" for spec in graph.inputs}
    for node in graph.nodes:
        for out in node.outputs:
            names[out] = f"tensor {out!r} (output of node {node.name!r}, op {node.op})"
    return names


def _runs(graph: Graph, batches: Iterable[dict[str, np.ndarray]],
          histograms: int) -> Iterator[dict[str, np.ndarray]]:
    """The samples of `batches` cut into runs of the interpreter of one size, as many as the memory budget
    lets one run hold beside the `histograms` bytes (the first batch's size at most), the last run shorter.

    The statistics do not depend on how samples are cut, so a batch whose size the budget does not divide
    (64 where 44 fit) is not run as 44 and 20: its rest waits for the next batch's first samples, and every
    run but the last has the size whose tensors the heap already holds (`arrays_reused_in_heap`)."""
    fit: int | None = None
    pending: list[dict[str, np.ndarray]] = []  # samples not yet run, fewer than `fit` between batches
    held = 0
    for batch in batches:
        count = _samples(batch)
        fit = fit or samples_that_fit(graph, "calibrate", count, histograms, "histograms")
        pending.append(batch)
        held += count
        while held >= fit:
            run, pending = _first(pending, fit)
            held -= fit
            yield run
    if held:
        yield _first(pending, held)[0]


def _samples(batch: dict[str, np.ndarray]) -> int:
    return len(next(iter(batch.values())))


def _first(pieces: list[dict[str, np.ndarray]], size: int) -> tuple[dict[str, np.ndarray], list[dict[str, np.ndarray]]]:
    """The first `size` samples of consecutive `pieces` as one batch (a view where one piece holds them), and
    the pieces left."""
    taken, left, need = [], [], size
    for piece in pieces:
        count = _samples(piece)
        if need >= count:
            taken.append(piece)
        elif need > 0:
            taken.append({name: array[:need] for name, array in piece.items()})
            left.append({name: array[need:] for name, array in piece.items()})
        else:
            left.append(piece)
        need = max(0, need - count)
    if len(taken) == 1:
        return taken[0], left
    return {name: np.concatenate([part[name] for part in taken]) for name in taken[0]}, left


def calibrate(graph: Graph, batches: Iterable[dict[str, np.ndarray]], progress: Progress,
              samples: int | None = None, per_channel: bool = True) -> Stats:
    """Run every batch through the float interpreter and fold its tensors into the histograms.

    Each tensor is counted as soon as the interpreter computes it and freed after its last reader, so
    memory holds one batch's live tensors, not all of them; a batch whose activations would pass the
    memory budget (dabuild.ir.memory) runs in parts. Large convs split their rows among the
    machine's cores (the results do not depend on the split). Runs take `fit` samples each whatever the
    batches (`_runs`), and their arrays come from a heap that keeps them for the next run.

    Table activations fused into conv/dense are split off first, so their
    inputs are observed too (as `activations.pre_activation(output)`). `per_channel` False keeps the
    whole-tensor histograms alone (see `Stats`): a fraction of the counting and of the memory.
    """
    graph = with_table_activations_split(graph)
    stats = Stats(per_channel=per_channel)
    where = _describe(graph)
    axes = ChannelAxes(graph)
    shapes: dict[str, tuple[int, ...]] = {}
    interpreter = Interpreter(graph, threads=available_cores())

    integer = set(graph.integer_inputs())  # token ids: not quantized, so no histograms

    def observe(name: str, values: np.ndarray) -> None:
        shapes[name] = values.shape
        if name not in integer:
            stats.observe(name, values, axes(name, shapes), where[name])

    with progress.track("calibrate", samples) as advance, arrays_reused_in_heap():
        for run in _runs(graph, batches, histogram_bytes(graph, per_channel)):
            interpreter.run(run, visit=observe)
            advance(_samples(run))
    if not stats.ranges:
        raise BuildError("calibration: no calibration samples were given")
    return stats
