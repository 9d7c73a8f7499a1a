"""Ops that move data without arithmetic: reshape, flatten, transpose, concat, split, slice, pad, squeeze,
unsqueeze, gather (constant indices), embedding (run-time integer indices into a constant table), tile,
expand."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from dabuild.ir.ops.base import (
    REQUIRED,
    Op,
    OutputSpec,
    ShapeError,
    broadcast_shapes,
    dims_agree,
    normalize_axes,
    normalize_axis,
    product,
    register,
)

if TYPE_CHECKING:
    from dabuild.ir.graph import TensorSpec


@register
class Reshape(Op):
    """Reshape to `shape`: -1 is inferred, 0 copies the input's size at that axis.

    0 lets a traced reshape keep the dynamic batch axis instead of baking in the
    batch size seen while tracing.
    """

    name = "reshape"
    defaults = {"shape": REQUIRED}
    rule = "shape, with 0 = the input's size at that axis and one -1 inferred"

    def samplewise(self, attrs: dict[str, Any]) -> bool:
        """A reshape that copies the batch size (0 first) keeps each sample's elements to itself."""
        attrs = self.resolve(attrs)
        return attrs["shape"][0] == 0

    def shape_rule(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        source = tuple(inputs[0].shape)
        target: list[int | None] = list(attrs["shape"])
        if target.count(-1) > 1:
            raise ShapeError(f"reshape target {target} has more than one -1")
        for axis, size in enumerate(target):
            if size == 0:
                if axis >= len(source):
                    raise ShapeError(f"reshape copies axis {axis} that input {source} lacks")
                target[axis] = source[axis]
            elif size is not None and size < -1:
                raise ShapeError(f"reshape target {attrs['shape']} has a negative size")
        copied = [source[a] for a, s in enumerate(attrs["shape"]) if s == 0]
        # Dynamic axes copied through cancel out; any other dynamic axis makes the total unknown.
        remaining: list[int | None] = [d for d in source if d is not None]
        if source.count(None) != copied.count(None):
            remaining = [None]
        total = product(remaining)
        known = math.prod(d for d, s in zip(target, attrs["shape"]) if s != -1 and d is not None)
        if total is not None and (
            (-1 in attrs["shape"] and (not known or total % known))
            or (-1 not in attrs["shape"] and known != total)
        ):
            raise ShapeError(f"cannot reshape {source} into {attrs['shape']}")
        if -1 in attrs["shape"]:
            target[attrs["shape"].index(-1)] = None if total is None else total // known
        return [(tuple(target), inputs[0].dtype)]

    def kernel(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        x = arrays[0]
        shape = [x.shape[a] if s == 0 else s for a, s in enumerate(attrs["shape"])]
        known = math.prod(size for size in shape if size != -1)
        if -1 in shape and known:
            shape[shape.index(-1)] = x.size // known
        channels = _channels_last_reshape(x, tuple(shape[1:])) if shape and shape[0] == len(x) else None
        return [x.reshape(shape) if channels is None else channels]


SLICED_COPIES = 16  # a regrouping copy loops over its shortest axis where that has at most this many entries


def _channels_last_reshape(x: np.ndarray, tail: tuple[int, ...]) -> np.ndarray | None:
    """x reshaped to (len(x), *tail) in channels-last memory, where the reshape keeps the batch and the trailing
    (spatial) axes and only regroups the axes between, and x's memory already holds those innermost (a conv's
    output, or a view of one); None otherwise (numpy's reshape then).

    ShuffleNet's channel shuffle (reshape to (N, g, C/g, H, W), swap g and C/g, reshape back) on a conv's
    channels-last output made numpy copy twice into channels-first order, and the next conv copy back: here
    the split is a view and the merge one copy into channels-last order, which the next conv reads as it is.
    """
    if x.flags.c_contiguous or x.ndim < 3:
        return None
    kept = 0  # trailing axes that the reshape keeps
    while kept < min(x.ndim, len(tail) + 1) - 2 and x.shape[x.ndim - 1 - kept] == tail[len(tail) - 1 - kept]:
        kept += 1
    middle = list(range(1, x.ndim - kept))
    spatial = list(range(x.ndim - kept, x.ndim))
    if not kept or not middle or len(tail) - kept < 1:
        return None
    by_memory = sorted(middle, key=lambda axis: -x.strides[axis])
    if not x.transpose(0, *spatial, *by_memory).flags.c_contiguous:
        return None
    inner = x.transpose(0, *spatial, *middle)
    if not inner.flags.c_contiguous:  # one copy, a slice of the shortest regrouped axis at a time
        copy = np.empty(inner.shape, x.dtype)
        shortest = min(range(1 + kept, inner.ndim), key=lambda axis: inner.shape[axis])
        if inner.shape[shortest] <= SLICED_COPIES:  # numpy's copy walked rows of that axis: 2-5x slower
            for index in range(inner.shape[shortest]):
                pick = (slice(None),) * shortest + (index,)
                copy[pick] = inner[pick]
            inner = copy
    inner = inner.reshape(len(x), *tail[len(tail) - kept:], *tail[:len(tail) - kept])
    regrouped = len(tail) - kept
    return inner.transpose(0, *range(1 + kept, 1 + kept + regrouped), *range(1, 1 + kept))


@register
class Flatten(Op):
    """ONNX Flatten: 2-D around `axis`, (prod(shape[:axis]), prod(shape[axis:]))."""

    name = "flatten"
    defaults = {"axis": 1}
    rule = "(prod(shape[:axis]), prod(shape[axis:]))"

    def samplewise(self, attrs: dict[str, Any]) -> bool:
        return bool(self.resolve(attrs)["axis"] != 0)

    def shape_rule(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        shape = tuple(inputs[0].shape)
        axis = normalize_axis(attrs["axis"], len(shape) + 1, "flatten")
        return [((product(shape[:axis]), product(shape[axis:])), inputs[0].dtype)]

    def kernel(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        shape = arrays[0].shape
        axis = attrs["axis"] % (len(shape) + 1)
        return [arrays[0].reshape(math.prod(shape[:axis]), math.prod(shape[axis:]))]


@register
class Transpose(Op):
    name = "transpose"
    defaults = {"perm": None}
    rule = "shape[perm]; perm None = reversed axes"

    def samplewise(self, attrs: dict[str, Any]) -> bool:
        """The batch axis must stay first."""
        attrs = self.resolve(attrs)
        return attrs["perm"] is not None and attrs["perm"][0] == 0

    def shape_rule(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        shape = tuple(inputs[0].shape)
        perm = attrs["perm"]
        if perm is None:
            return [(shape[::-1], inputs[0].dtype)]
        if sorted(perm) != list(range(len(shape))):
            raise ShapeError(f"transpose perm {perm} is not a permutation of the {len(shape)} axes of {shape}")
        return [(tuple(shape[a] for a in perm), inputs[0].dtype)]

    def kernel(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        return [np.transpose(arrays[0], attrs["perm"])]


@register
class Concat(Op):
    name = "concat"
    arity = (1, 1 << 16)
    defaults = {"axis": REQUIRED}
    signature = "x1, ..., xn"
    rule = "inputs joined along axis; other axes equal"

    def samplewise(self, attrs: dict[str, Any]) -> bool:
        """Joining along any axis but the batch (a negative axis counts from the end, never the batch)."""
        attrs = self.resolve(attrs)
        return attrs["axis"] != 0

    def shape_rule(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        shapes = [tuple(spec.shape) for spec in inputs]
        rank = len(shapes[0])
        axis = normalize_axis(attrs["axis"], rank, "concat")
        result = list(shapes[0])
        for shape in shapes[1:]:
            if len(shape) != rank or not all(dims_agree(a, b) for i, (a, b) in enumerate(zip(result, shape)) if i != axis):
                raise ShapeError(f"concat inputs {', '.join(map(str, shapes))} differ off axis {axis}")
            result = [a if a is not None else b for a, b in zip(result, shape)]
        sizes = [shape[axis] for shape in shapes]
        result[axis] = None if None in sizes else sum(sizes)  # type: ignore[arg-type]
        return [(tuple(result), inputs[0].dtype)]

    def kernel(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        return [np.concatenate(arrays, axis=attrs["axis"])]


@register
class Split(Op):
    name = "split"
    defaults = {"axis": 0, "sizes": REQUIRED}
    rule = "one output per entry of sizes, each that long along axis"

    def samplewise(self, attrs: dict[str, Any]) -> bool:
        """Splitting along any axis but the batch."""
        attrs = self.resolve(attrs)
        return attrs["axis"] != 0

    def shape_rule(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        shape = tuple(inputs[0].shape)
        axis = normalize_axis(attrs["axis"], len(shape), "split")
        sizes = attrs["sizes"]
        if not sizes or any(size < 0 for size in sizes) or not dims_agree(shape[axis], sum(sizes)):
            raise ShapeError(f"split sizes {sizes} do not add up to axis {axis} of {shape}")
        return [((*shape[:axis], size, *shape[axis + 1:]), inputs[0].dtype) for size in sizes]

    def kernel(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        bounds = np.cumsum(attrs["sizes"])[:-1]
        return np.split(arrays[0], bounds, axis=attrs["axis"])


def _slice_bounds(size: int, start: int, end: int, step: int) -> tuple[int, int, int]:
    """ONNX Slice: negative indices count from the end, then clamp; (start, end, length)."""
    start = start + size if start < 0 else start
    end = end + size if end < 0 else end
    if step > 0:
        start, end = min(max(start, 0), size), min(max(end, 0), size)
        return start, end, max(0, -(-(end - start) // step))
    start, end = min(max(start, 0), size - 1), min(max(end, -1), size - 1)
    return start, end, max(0, -(-(start - end) // -step))


@register
class Slice(Op):
    """ONNX Slice: starts/ends per listed axis (default the first len(starts) axes), clamped to the axis."""

    name = "slice"
    defaults = {"starts": REQUIRED, "ends": REQUIRED, "axes": None, "steps": None}
    rule = "per axis: len(range(start, end, step)) after ONNX clamping"

    def samplewise(self, attrs: dict[str, Any]) -> bool:
        """Slicing only axes listed explicitly, none of them the batch (no axes means the first ones)."""
        attrs = self.resolve(attrs)
        return attrs["axes"] is not None and 0 not in attrs["axes"]

    def plan(self, rank: int, attrs: dict[str, Any]) -> list[tuple[int, int, int, int]]:
        """(axis, start, end, step) per sliced axis."""
        starts, ends = attrs["starts"], attrs["ends"]
        axes = attrs["axes"] if attrs["axes"] is not None else list(range(len(starts)))
        steps = attrs["steps"] if attrs["steps"] is not None else [1] * len(starts)
        if not len(starts) == len(ends) == len(axes) == len(steps):
            raise ShapeError(f"slice starts {starts}, ends {ends}, axes {axes}, steps {steps} differ in length")
        if 0 in steps:
            raise ShapeError("slice steps must not be 0")
        return list(zip(normalize_axes(axes, rank, "slice"), starts, ends, steps))

    def shape_rule(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        shape = list(inputs[0].shape)
        for axis, start, end, step in self.plan(len(shape), attrs):
            size = shape[axis]
            if size is not None:
                shape[axis] = _slice_bounds(size, start, end, step)[2]
        return [(tuple(shape), inputs[0].dtype)]

    def kernel(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        x = arrays[0]
        index = [slice(None)] * x.ndim
        for axis, start, end, step in self.plan(x.ndim, attrs):
            begin, stop, _ = _slice_bounds(x.shape[axis], start, end, step)
            index[axis] = slice(begin, None if stop < 0 else stop, step)
        return [x[tuple(index)]]


@register
class Pad(Op):
    name = "pad"
    defaults = {"pads": REQUIRED, "mode": "constant", "value": 0.0}
    rule = "each axis grows by its begin and end pads; mode constant, reflect or edge"
    modes = ("constant", "reflect", "edge")

    def samplewise(self, attrs: dict[str, Any]) -> bool:
        """No padding of the batch axis."""
        attrs = self.resolve(attrs)
        return attrs["pads"][0] == 0 and attrs["pads"][len(attrs["pads"]) // 2] == 0

    def shape_rule(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        shape, pads = tuple(inputs[0].shape), attrs["pads"]
        rank = len(shape)
        if attrs["mode"] not in self.modes:
            raise ShapeError(f"pad mode {attrs['mode']!r} is not one of {', '.join(self.modes)}")
        if len(pads) != 2 * rank or any(p < 0 for p in pads):
            raise ShapeError(f"pad pads {pads} must be {2 * rank} non-negative numbers for {shape}")
        if attrs["mode"] == "reflect" and any(
            d is not None and max(pads[a], pads[a + rank]) >= d for a, d in enumerate(shape)
        ):
            raise ShapeError(f"reflect pads {pads} must be smaller than the axes of {shape}")
        out = tuple(None if d is None else d + pads[a] + pads[a + rank] for a, d in enumerate(shape))
        return [(out, inputs[0].dtype)]

    def kernel(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        x, pads = arrays[0], attrs["pads"]
        widths = [(pads[a], pads[a + x.ndim]) for a in range(x.ndim)]
        if attrs["mode"] == "constant":
            return [np.pad(x, widths, constant_values=np.asarray(attrs["value"], x.dtype))]
        return [np.pad(x, widths, mode=attrs["mode"])]


@register
class Squeeze(Op):
    name = "squeeze"
    defaults = {"axes": None}
    rule = "shape without the listed size-1 axes (None = every size-1 axis)"

    def samplewise(self, attrs: dict[str, Any]) -> bool:
        """Squeezing listed axes other than the batch."""
        attrs = self.resolve(attrs)
        return attrs["axes"] is not None and 0 not in attrs["axes"]

    def axes(self, shape: tuple[int | None, ...], attrs: dict[str, Any]) -> tuple[int, ...]:
        if attrs["axes"] is None:
            return tuple(a for a, d in enumerate(shape) if d == 1)
        axes = normalize_axes(attrs["axes"], len(shape), "squeeze")
        if any(shape[a] != 1 for a in axes):
            raise ShapeError(f"squeeze axes {attrs['axes']} of {shape} are not all of size 1")
        return tuple(axes)

    def shape_rule(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        shape = tuple(inputs[0].shape)
        axes = self.axes(shape, attrs)
        return [(tuple(d for a, d in enumerate(shape) if a not in axes), inputs[0].dtype)]

    def kernel(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        return [np.squeeze(arrays[0], self.axes(arrays[0].shape, attrs))]


@register
class Unsqueeze(Op):
    name = "unsqueeze"
    defaults = {"axes": REQUIRED}
    rule = "size-1 axes inserted at the listed positions of the output"

    def samplewise(self, attrs: dict[str, Any]) -> bool:
        """Inserting axes after the batch."""
        attrs = self.resolve(attrs)
        return 0 not in attrs["axes"]

    def shape_rule(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        shape = list(inputs[0].shape)
        axes = sorted(normalize_axes(attrs["axes"], len(shape) + len(attrs["axes"]), "unsqueeze"))
        for axis in axes:
            shape.insert(axis, 1)
        return [(tuple(shape), inputs[0].dtype)]

    def kernel(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        return [np.expand_dims(arrays[0], tuple(attrs["axes"]))]


@register
class Gather(Op):
    """ONNX Gather with constant indices: x's entries at `indices` along `axis` (negative indices count
    from the end); the indices' shape replaces that axis."""

    name = "gather"
    defaults = {"axis": 0, "indices": REQUIRED}
    rule = "shape[:axis] + shape(indices) + shape[axis + 1:]"

    def samplewise(self, attrs: dict[str, Any]) -> bool:
        return bool(self.resolve(attrs)["axis"] != 0)

    def shape_rule(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        shape = tuple(inputs[0].shape)
        axis = normalize_axis(attrs["axis"], len(shape), "gather")
        indices = np.asarray(attrs["indices"], dtype=np.int64)
        size = shape[axis]
        if size is not None and indices.size and not (-size <= indices.min() and indices.max() < size):
            raise ShapeError(f"gather indices {attrs['indices']} are out of range for axis {axis} of {shape}")
        return [((*shape[:axis], *indices.shape, *shape[axis + 1:]), inputs[0].dtype)]

    def kernel(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        return [np.take(arrays[0], np.asarray(attrs["indices"], dtype=np.int64), axis=attrs["axis"])]


def out_of_range(indices: np.ndarray, rows: int) -> str | None:
    """Why integer `indices` cannot pick rows of a table of `rows` rows (the first bad one), or None."""
    bad = np.flatnonzero((np.ravel(indices) < 0) | (np.ravel(indices) >= rows))
    if not bad.size:
        return None
    where = np.unravel_index(int(bad[0]), np.shape(indices))
    count = "1 index lies" if bad.size == 1 else f"{bad.size} indices lie"
    return (f"{count} outside the table's rows 0..{rows - 1}, the first {int(np.ravel(indices)[bad[0]])} "
            f"at position {list(map(int, where))}")


@register
class Embedding(Op):
    """Rows of a constant table at integer indices that arrive at run time (token ids): ONNX Gather(table, ids)
    along axis 0, torch's nn.Embedding. The indices come first, so the table is input 1 like every weight.
    Indices outside 0..rows-1 are an error (never wrapped or clamped): ONNX's negative indices are refused."""

    name = "embedding"
    per_sample = True
    reads_indices = True  # a float island would dequantize the ids into floats
    arity = (2, 2)
    signature = "indices (integer), table (rows, ...)"
    rule = "shape(indices) + table.shape[1:]"

    def shape_rule(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        indices, table = inputs
        if np.dtype(indices.dtype).kind not in "iu":
            raise ShapeError(f"embedding indices must be integers, got {indices.dtype}")
        if not table.shape:
            raise ShapeError("embedding table must have at least one axis (its rows)")
        return [((*indices.shape, *table.shape[1:]), table.dtype)]

    def kernel(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        indices, table = arrays
        problem = out_of_range(indices, len(table))
        if problem is not None:
            raise ShapeError(f"embedding: {problem}")
        return [np.take(table, indices, axis=0)]


@register
class Tile(Op):
    """ONNX Tile: each axis repeated `repeats` times (the batch axis must repeat once)."""

    name = "tile"
    per_sample = True
    defaults = {"repeats": REQUIRED}
    rule = "shape[i] * repeats[i] per axis"

    def shape_rule(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        shape, repeats = tuple(inputs[0].shape), list(attrs["repeats"])
        if len(repeats) != len(shape) or any(r < 0 for r in repeats):
            raise ShapeError(f"tile repeats {repeats} need one non-negative entry per axis of {shape}")
        return [(tuple(None if d is None else d * r for d, r in zip(shape, repeats)), inputs[0].dtype)]

    def samplewise(self, attrs: dict[str, Any]) -> bool:
        return bool(self.resolve(attrs)["repeats"][0] == 1)

    def kernel(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        return [np.tile(arrays[0], attrs["repeats"])]


@register
class Expand(Op):
    """ONNX Expand: x broadcast against `shape` (numpy rules, so the result may be larger than `shape`)."""

    name = "expand"
    per_sample = True
    defaults = {"shape": REQUIRED}
    rule = "numpy broadcast of x's shape and shape"

    def shape_rule(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        return [(broadcast_shapes(tuple(inputs[0].shape), tuple(attrs["shape"])), inputs[0].dtype)]

    def kernel(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        x = arrays[0]
        return [np.array(np.broadcast_to(x, np.broadcast_shapes(x.shape, tuple(attrs["shape"]))))]
