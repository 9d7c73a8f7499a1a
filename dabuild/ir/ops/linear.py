"""The ops with weights: matmul, dense, conv, batch_norm.

Conv runs as channels-last im2col + one BLAS matmul per block of images: each
block is padded into a (block, *spatial, C) buffer, `windows_last` gives a
strided view of every receptive field, one copy turns it into (rows, K) columns,
and the matmul with the (K, O) weight writes (rows, O) straight into the
output, where bias and activation (and, in an interpreter plan, a residual
block's add and the activation after it) are applied while the block is in cache.
One tall (rows, K) @ (K, O) matmul per block ran about 1.4x faster in
OpenBLAS than the (O, K) @ (K, H*W) per-image form; with fewer than 32
output channels, each row computes two neighbouring outputs (see
`_paired_columns_conv`). The result is returned as the (N, O, *out)
transposed view of its (N, *out, O) memory: every op sees NCHW semantics, and
a following conv reads that memory channels-last without a transpose.
A depthwise conv (one input channel per group) instead accumulates its few
kernel taps elementwise, which never builds the mostly-zero block-diagonal
weight a single matmul would need.

Where a C compiler is available, a float32 conv over one or two spatial axes
instead runs as a compiled direct convolution (dabuild.ir.kernels.native):
about twice as fast as im2col + BLAS on a small CNN, with the same
channels-last output memory and the same epilogue. A depthwise conv (one
output channel per input channel) has its own kernel; any other grouped conv
runs group by group in the ungrouped one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from dabuild.ir.kernels.native import (
    CLAMP,
    NO_ACTIVATION,
    RELU,
    ConvPlan,
    NativeActivation,
    PackedWeight,
    native_conv,
    native_switched_on,
)
from dabuild.ir.ops.activation import check_activation, fused_activation
from dabuild.ir.ops.base import (
    Kernel,
    Op,
    OutputSpec,
    ShapeError,
    broadcast_shapes,
    check_vector,
    dims_agree,
    fits,
    register,
)
from dabuild.ir.ops.window import Padder, channels_last, output_sizes, pad_widths, window_attrs, windows, windows_last

if TYPE_CHECKING:
    from dabuild.ir.graph import TensorSpec

FUSED_ACTIVATION = {"activation": "none", "activation_attrs": {}}
UNCHANGED = fused_activation(FUSED_ACTIVATION)


@register
class MatMul(Op):
    """numpy.matmul: 1-D operands are promoted and the promoted axis dropped again."""

    name = "matmul"
    per_sample = True  # over batch-first operands: a stack of matrices per sample, or rows times a constant
    arity = (2, 2)
    signature = "a, b"
    rule = "numpy.matmul: (..., m, k) @ (..., k, n) -> (broadcast ..., m, n)"

    def shape_rule(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        a, b = tuple(inputs[0].shape), tuple(inputs[1].shape)
        if not a or not b:
            raise ShapeError("matmul does not take scalars")
        a2 = (1, *a) if len(a) == 1 else a
        b2 = (*b, 1) if len(b) == 1 else b
        if not dims_agree(a2[-1], b2[-2]):
            raise ShapeError(f"matmul inner dimensions differ: {a} @ {b}")
        batch = broadcast_shapes(a2[:-2], b2[:-2])
        out = (*batch, *(a2[-2:-1] if len(a) > 1 else ()), *(b2[-1:] if len(b) > 1 else ()))
        return [(out, inputs[0].dtype)]

    def kernel(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        return [np.matmul(arrays[0], arrays[1])]


@register
class Dense(Op):
    """y = activation(x @ weight + bias); weight (in, out), bias (out,) optional.

    The canonical form of a fully connected layer: quantizers and targets
    handle this one op instead of every matmul/add spelling a frontend emits.
    """

    name = "dense"
    per_sample = True
    arity = (2, 3)
    defaults = FUSED_ACTIVATION
    signature = "x, weight (in, out), bias? (out,)"
    rule = "(..., in) -> (..., out)"

    def shape_rule(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        check_activation(self.name, attrs)
        x, weight = inputs[0].shape, inputs[1].shape
        if len(weight) != 2:
            raise ShapeError(f"dense weight must be 2-D (in, out), got {weight}")
        if not x or not dims_agree(x[-1], weight[0]):
            raise ShapeError(f"dense input {x} does not end in the weight's in_features {weight[0]}")
        if len(inputs) == 3 and tuple(inputs[2].shape) != (weight[1],):
            raise ShapeError(f"dense bias must have shape ({weight[1]},), got {inputs[2].shape}")
        return [((*x[:-1], weight[1]), inputs[0].dtype)]

    def kernel(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        return self.prepare(attrs)(arrays, None)

    def prepare(self, attrs: dict[str, Any]) -> Kernel:
        """float32 rows run as a 1x1 conv of the native kernels (see `_native_dense`), else numpy's matmul."""
        resolved = self.resolve(attrs)
        activation = fused_activation(resolved)
        native_activation = _native_activation(resolved)
        cache = NativeCache()
        as_conv: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # each weight's (O, in, 1, 1) view, made once

        def dense(arrays: list[np.ndarray], out: np.ndarray | None) -> list[np.ndarray]:
            x, weight = arrays[0], arrays[1]
            bias = arrays[2] if len(arrays) == 3 else None
            entry = as_conv.get(id(weight))
            if entry is None or entry[0] is not weight:
                entry = as_conv[id(weight)] = (weight, weight.T[:, :, None, None])
            y = _native_dense(x, entry[1], Epilogue(bias, None, activation, native_activation), cache)
            if y is not None:
                return [y]
            y = np.matmul(x, weight)
            if bias is not None:
                y += bias
            return [activation(y)]

        return dense


def _native_dense(x: np.ndarray, weight: np.ndarray, epilogue: Epilogue, cache: NativeCache) -> np.ndarray | None:
    """x (..., in) @ weight as the native 1x1 conv of the (rows, in, 1, 1) image `x` with the (out, in, 1, 1)
    `weight`, or None where the native conv does not run it.

    Why not BLAS: a GEMM's rounding depends on how many rows it gets (a one-row call takes another code path
    than a 64-row one), so a batch that a memory budget cut in two would change the outputs' bits. The native
    conv sums each output in one fixed order, whatever the batch, its split or the threads.
    """
    if x.ndim < 1 or x.dtype != weight.dtype:
        return None
    rows = x.reshape(-1, x.shape[-1], 1, 1)
    y = _native_conv(rows, weight, 1, Geometry([1, 1], [1, 1], [0, 0, 0, 0], [1, 1]), [1, 1], epilogue, cache)
    return None if y is None else y.reshape(*x.shape[:-1], weight.shape[0])


def conv_geometry(attrs: dict[str, Any], spatial: int) -> tuple[list[int], list[int], list[int]]:
    """strides, pads, dilations with their defaults (1, 0, 1 on every spatial axis) filled in."""
    return (
        list(attrs["strides"] or [1] * spatial),
        list(attrs["pads"] or [0] * (2 * spatial)),
        list(attrs["dilations"] or [1] * spatial),
    )


@register
class Conv(Op):
    """Convolution over 1 or more spatial axes (ONNX Conv), with optional bias and fused activation."""

    name = "conv"
    per_sample = True
    arity = (2, 3)
    in_place = (0,)
    defaults = {"strides": None, "pads": None, "dilations": None, "groups": 1, **FUSED_ACTIVATION}
    signature = "x (N, C, *spatial), weight (O, C/groups, *kernel), bias? (O,)"
    rule = "(N, C, *in) -> (N, O, *out), out = (in + pads - dilation*(kernel-1) - 1) // stride + 1"

    def shape_rule(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        check_activation(self.name, attrs)
        x, weight = tuple(inputs[0].shape), tuple(inputs[1].shape)
        kernel = list(weight[2:])
        if len(weight) != len(x):
            raise ShapeError(f"conv weight {weight} must have the rank of input {x}")
        window_attrs(self.name, x, kernel, attrs)  # type: ignore[arg-type]
        groups, channels, out_channels = attrs["groups"], x[1], weight[0]
        if groups < 1 or out_channels % groups:
            raise ShapeError(f"conv groups {groups} must divide the {out_channels} output channels")
        if channels is not None and channels != weight[1] * groups:
            raise ShapeError(f"conv input has {channels} channels; weight {weight} with groups {groups} takes "
                             f"{weight[1] * groups}")
        if len(inputs) == 3 and tuple(inputs[2].shape) != (out_channels,):
            raise ShapeError(f"conv bias must have shape ({out_channels},), got {inputs[2].shape}")
        out = output_sizes(x, kernel, *conv_geometry(attrs, len(kernel)))  # type: ignore[arg-type]
        return [((x[0], out_channels, *out), inputs[0].dtype)]

    def kernel(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        return self.prepare(attrs)(arrays, None)

    def prepare(self, attrs: dict[str, Any]) -> Kernel:
        return self.prepare_residual(attrs, None)

    def prepare_residual(self, attrs: dict[str, Any], then: tuple[str, dict[str, Any]] | None) -> Kernel:
        """The kernel; with `then`, the kernel of activation(conv(x) + residual) instead, residual its last input.

        `then` names the activation (op name, attributes; "none" for none) that follows the add. An
        interpreter plan fuses conv -> add -> activation of a residual block into this kernel: the add and
        the activation then run on each block of output rows while it is in cache, the same float
        operations in the same order as the three separate nodes.
        """
        attrs = self.resolve(attrs)
        groups = attrs["groups"]
        activation_attrs = attrs if then is None else {"activation": then[0], "activation_attrs": then[1]}
        activation = fused_activation(activation_attrs)
        native_activation = _native_activation(activation_attrs)
        cache = NativeCache()

        def conv(arrays: list[np.ndarray], out: np.ndarray | None) -> list[np.ndarray]:
            x, weight = arrays[0], arrays[1]
            residual = arrays[-1] if then is not None else None
            bias = arrays[2] if len(arrays) - (then is not None) == 3 else None
            planned = cache.planned(x, weight, bias, residual)
            if planned is not None:
                return [planned(x, residual)]
            geometry = Geometry(list(weight.shape[2:]), *conv_geometry(attrs, weight.ndim - 2))
            # Concrete input sizes give concrete output sizes.
            sizes = output_sizes(
                x.shape, geometry.kernel, geometry.strides, geometry.pads, geometry.dilations)
            shape = (x.shape[0], weight.shape[0], *sizes)
            if residual is not None and (residual.shape != shape or residual.dtype != np.result_type(x, weight)):
                # A broadcasting or type-promoting add: conv, then the add and activation as the nodes would.
                y = _conv(x, weight, bias, groups, geometry, sizes, Epilogue(bias, None, UNCHANGED), out, cache)
                return [activation(np.add(y, residual))]
            epilogue = Epilogue(bias, residual, activation, native_activation)
            return [_conv(x, weight, bias, groups, geometry, sizes, epilogue, out, cache)]

        return conv


def _native_activation(attrs: dict[str, Any]) -> NativeActivation | None:
    """The fused activation as the native conv applies it (relu, relu6, clip), or None if it cannot."""
    name, params = attrs["activation"], attrs.get("activation_attrs") or {}
    if name == "none":
        return NO_ACTIVATION
    if name == "relu":
        return (RELU, 0.0, 0.0)
    if name == "relu6":
        return (CLAMP, 0.0, 6.0)
    if name == "clip":
        low, high = params.get("min"), params.get("max")
        return (CLAMP, -math.inf if low is None else float(np.float32(low)),
                math.inf if high is None else float(np.float32(high)))
    return None


def _conv(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, groups: int, geometry: Geometry,
          sizes: list[int], epilogue: Epilogue, out: np.ndarray | None, cache: NativeCache | None = None) -> np.ndarray:
    """The conv by the fastest method that applies to its shapes and memory order (see the module docstring)."""
    native = _native_conv(x, weight, groups, geometry, sizes, epilogue, cache)
    if native is not None:
        return native
    if groups == x.shape[1] and weight.shape[1] == 1:
        y = _depthwise(x, weight, geometry, sizes).reshape(x.shape[0], weight.shape[0], *sizes)
        epilogue(channels_last(y), 0)
        return y
    if groups == 1 and _pairs_columns(x, weight, geometry, sizes):
        return _paired_columns_conv(x, weight, geometry, sizes, epilogue, out)
    return _im2col_matmul(x, weight, groups, geometry, sizes, epilogue, out)


def _native_conv(x: np.ndarray, weight: np.ndarray, groups: int, geometry: Geometry, sizes: list[int],
                 epilogue: Epilogue, cache: NativeCache | None = None) -> np.ndarray | None:
    """The conv by the compiled direct conv of dabuild.ir.kernels, or None where that does not apply: not float32
    or float64, more than two spatial axes, DABUILD_NATIVE_KERNELS=0 or no C compiler.

    The kernel adds the bias and the residual and applies relu or a clamp (relu6, clip); another activation
    runs afterwards in numpy. A 1-D conv runs as a 2-D conv of height 1. `cache` keeps each weight's packed
    form and the prepared call for the next call of a prepared kernel (whose weight is the same graph constant
    each time).
    """
    spatial = weight.ndim - 2
    depthwise = groups == x.shape[1] == weight.shape[0] and weight.shape[1] == 1 and groups > 1
    if spatial not in (1, 2) or x.dtype != weight.dtype:
        return None
    conv = native_conv()
    if conv is None or not conv.takes(x.dtype):
        return None
    lifted = 2 - spatial  # leading geometry entries of the height-1 axis
    strides, dilations = [1] * lifted + geometry.strides, [1] * lifted + geometry.dilations
    pads = [0] * lifted + geometry.pads[:spatial]  # the begin pads; the kernel bounds-checks the end
    bias = None if epilogue.bias is None else epilogue.bias.astype(x.dtype, copy=False)
    cache = cache or NativeCache()
    packed = cache.pack(conv, weight, depthwise, 1 if depthwise else groups)
    plan = conv.plan(_rows_shape(x.shape), packed, bias, strides, pads, dilations, [1] * lifted + sizes,
                     epilogue.native_activation or NO_ACTIVATION)
    planned = PlannedConv(plan, sizes, None if epilogue.native_activation is not None else epilogue.activation)
    cache.keep(x, weight, epilogue.bias, epilogue.residual, planned)
    return planned(x, epilogue.residual)


def _rows_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The (N, H, W, C) shape the native conv sees of an (N, C, *spatial) input of one or two spatial axes."""
    return (shape[0], *([1] * (4 - len(shape))), *shape[2:], shape[1])


FEW_CHANNELS = 4  # channels-first inputs with at most this many channels are copied channel by channel


def _rows(a: np.ndarray) -> np.ndarray:
    """(N, C, *spatial) as C-contiguous (N, H, W, C): the memory itself for a tensor kept channels last.

    A channels-first image of 3 channels (a network's input) is copied one channel at a time: numpy's copy
    of the transposed view walks 3-element rows and took 0.24 ms for one 224x224 image, a fifth of the
    stem conv after it; by channel, 0.06 ms."""
    four = a if a.ndim == 4 else a[:, :, None]
    last = four.transpose(0, 2, 3, 1)
    if last.flags.c_contiguous:
        return last
    if four.shape[1] > FEW_CHANNELS:
        return np.ascontiguousarray(last)
    rows = np.empty(last.shape, a.dtype)
    for channel in range(four.shape[1]):
        rows[..., channel] = four[:, channel]
    return rows


@dataclass
class PlannedConv:
    """A native conv prepared for one input shape: its call, and the activation numpy applies after it (if the
    kernel cannot). Called with the graph's (N, C, *spatial) tensors, returns the (N, O, *out) result as the
    transposed view of its channels-last memory."""

    plan: ConvPlan
    sizes: list[int]
    activation: Callable[[np.ndarray], np.ndarray] | None

    def __post_init__(self) -> None:
        self.shape = (self.plan.shape[0], *self.sizes, self.plan.shape[-1])  # (N, *out, O) channels last
        self.axes = (0, len(self.shape) - 1, *range(1, 1 + len(self.sizes)))  # to (N, O, *out)

    def __call__(self, x: np.ndarray, residual: np.ndarray | None) -> np.ndarray:
        y = self.plan(_rows(x), None if residual is None else _rows(residual)).reshape(self.shape)
        if self.activation is not None:
            self.activation(y)
        return y.transpose(self.axes)


class NativeCache:
    """What a prepared conv kernel keeps between calls: each weight's packed form (by the weight's id) and the
    prepared native call of the last input shape, used again while the weight, bias and input shape stay."""

    def __init__(self) -> None:
        self.packs: dict[int, tuple[np.ndarray, PackedWeight]] = {}
        self.last: tuple[tuple[Any, ...], np.ndarray, np.ndarray | None, PlannedConv] | None = None

    def pack(self, native: Any, weight: np.ndarray, depthwise: bool, groups: int) -> PackedWeight:
        entry = self.packs.get(id(weight))
        if entry is None or entry[0] is not weight:
            entry = (weight, native.pack(weight if weight.ndim == 4 else weight[:, :, None], depthwise, groups))
            self.packs[id(weight)] = entry
        return entry[1]

    def keep(self, x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, residual: np.ndarray | None,
             planned: PlannedConv) -> None:
        self.last = (self._key(x, residual), weight, bias, planned)

    def planned(self, x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None,
                residual: np.ndarray | None) -> PlannedConv | None:
        """The prepared call if it fits these arrays (the same weight and bias, x's shape and dtype, a residual
        of the output's shape and dtype where the plan adds one) and the native kernels are still on. A prepared
        call keeps the vector path it was prepared with: `native_conv`, which also reads that, cost 3 us a layer."""
        last = self.last
        if (last is None or last[1] is not weight or last[2] is not bias or last[0] != self._key(x, residual)
                or not native_switched_on()):
            return None
        return last[3]

    @staticmethod
    def _key(x: np.ndarray, residual: np.ndarray | None) -> tuple[Any, ...]:
        return (x.shape, x.dtype, None if residual is None else (residual.shape, residual.dtype))


@dataclass
class Epilogue:
    """What a conv applies to each finished block of images while it is in cache: + bias, + residual, activation."""

    bias: np.ndarray | None
    residual: np.ndarray | None  # (N, O, *out), the other operand of a fused add
    activation: Callable[[np.ndarray], np.ndarray]
    native_activation: NativeActivation | None = None  # the activation as the native kernel applies it, if it can

    def __call__(self, block: np.ndarray, start: int) -> None:
        """Finish `block`, the (count, *out, O) channels-last outputs of images start, start + 1, ... in place."""
        if self.bias is not None:
            _add_bias(block, self.bias.astype(block.dtype, copy=False))
        if self.residual is not None:
            block += channels_last(self.residual)[start:start + len(block)]
        self.activation(block)


BIAS_TILE = 256  # the bias is tiled over up to this many rows


def _add_bias(block: np.ndarray, bias: np.ndarray) -> None:
    """block += bias along its last axis; a contiguous block as whole rows of a tiled bias, because numpy
    adds two contiguous runs with SIMD but a broadcast (O,) row without."""
    if not block.flags.c_contiguous:
        block += bias
        return
    rows = block.reshape(-1, len(bias))
    tile = math.gcd(len(rows), BIAS_TILE)
    rows = rows.reshape(-1, tile * len(bias))
    np.add(rows, np.tile(bias, tile), out=rows)


@dataclass
class Geometry:
    kernel: list[int]
    strides: list[int]
    pads: list[int]
    dilations: list[int]

    def padder(self, x: np.ndarray, block: int, out: list[int], channels_last: bool = False) -> Padder:
        widths = pad_widths(x.shape, self.kernel, self.strides, self.pads, self.dilations, out)
        return Padder(x.shape, block, widths, 0.0, x.dtype, channels_last)

    def windows(self, padded: np.ndarray, out: list[int]) -> np.ndarray:
        """The (N, C, *kernel, *out) window view of an already padded x."""
        return windows(padded, self.kernel, self.strides, self.dilations, out)


COLUMN_BYTES = 1 << 20  # im2col works on blocks of images whose columns fit a core's L2 cache


def _im2col_matmul(
    x: np.ndarray, weight: np.ndarray, groups: int, geometry: Geometry, out: list[int],
    finish: Callable[[np.ndarray, int], None], overwritable: np.ndarray | None = None,
) -> np.ndarray:
    """conv(x), each block of images finished by `finish(block, start)` (an `Epilogue`), as the (N, O, *out)
    view of an (N, *out, O) array (see the module docstring).

    `overwritable` is x when the caller no longer needs it: if the output has x's shape and x is channels
    last in memory, the output goes into x's memory. That is safe because block after block, the images
    of a block are copied out of x (into the padding buffer or the columns) before their outputs, which
    take exactly the same bytes, are written.

    The columns follow x's memory order, so the im2col copy reads runs of contiguous elements: channels
    last (rows = every image's output positions, K = (*kernel, channel)) when x came from another conv,
    channels first (one (positions, K) matrix per image, K = (channel, *kernel), read transposed by BLAS)
    when x is an ordinary NCHW array such as a graph input.
    """
    batch, channels = x.shape[:2]
    spatial, length, taps = len(out), math.prod(out), math.prod(geometry.kernel)
    out_channels = weight.shape[0]
    group_in, group_out = channels // groups, out_channels // groups
    depth = group_in * taps  # K of each group's matrix
    dtype = np.result_type(x, weight)
    block = min(batch, max(1, COLUMN_BYTES // (channels * taps * length * dtype.itemsize)))
    last = channels_last(x).flags.c_contiguous
    pad = geometry.padder(x, block, out, channels_last=last)
    # One window view serves every block: of x itself, or of the padding buffer that each block is copied into.
    source = pad(x) if pad.buffer is None else pad.buffer
    weights = weight.reshape(groups, group_out, group_in, taps)
    if last:
        view = windows_last(source, geometry.kernel, geometry.strides, geometry.dilations, out)
        view = view.reshape(*view.shape[:-1], groups, group_in)  # (N, *out, *kernel, groups, C/groups)
        view = view.transpose(0, *range(1, 1 + spatial), 1 + 2 * spatial, *range(1 + spatial, 1 + 2 * spatial), -1)
        weights = weights.transpose(0, 3, 2, 1).reshape(groups, depth, group_out)
    else:
        view = geometry.windows(source, out)  # (N, C, *kernel, *out)
        view = view.reshape(len(view), groups, group_in, *view.shape[2:])
        weights = weights.transpose(0, 2, 3, 1).reshape(groups, depth, group_out)
    columns = np.empty((block, *view.shape[1:]), dtype)
    if (reusable := fits(overwritable, (batch, out_channels, *out), dtype)) is not None and last:
        y = channels_last(reusable)
    else:
        y = np.empty((batch, *out, out_channels), dtype)
    for start in range(0, batch, block):
        count = min(block, batch - start)
        if pad.buffer is None:
            windows_of_block = view[start:start + count]
        else:
            pad(x[start:start + count])
            windows_of_block = view[:count]
        part = columns[:count]
        np.copyto(part, windows_of_block)  # the im2col copy (np.copyto is far faster here than reshape's)
        images = 1 if last else count  # matrices per group: (rows, K) each
        if last:
            matrices = part.reshape(1, -1, groups, depth).transpose(0, 2, 1, 3)
        else:
            matrices = part.reshape(count, groups, depth, length).transpose(0, 1, 3, 2)
        result = y[start:start + count]
        np.matmul(matrices, weights, out=result.reshape(images, -1, groups, group_out).transpose(0, 2, 1, 3))
        finish(result, start)
    return y.transpose(0, -1, *range(1, 1 + spatial))


NARROW = 32  # convs with fewer output channels compute two neighbouring output columns per matmul row


def _pairs_columns(x: np.ndarray, weight: np.ndarray, geometry: Geometry, out: list[int]) -> bool:
    """Whether `_paired_columns_conv` applies (and pays): few output channels, unit stride and dilation, even
    width, and x channels last in memory (for a channels-first x, as a 3-channel input image, it measured slower)."""
    return (weight.shape[0] < NARROW and geometry.strides[-1] == 1 and geometry.dilations[-1] == 1
            and out[-1] % 2 == 0 and channels_last(x).flags.c_contiguous)


def _paired_columns_conv(
    x: np.ndarray, weight: np.ndarray, geometry: Geometry, out: list[int], epilogue: Epilogue,
    overwritable: np.ndarray | None,
) -> np.ndarray:
    """The conv as one that computes each pair of neighbouring outputs along the last axis at once.

    BLAS runs a tall matmul with few (O) columns far below its peak. The
    paired conv's kernel is one wider (each row holds the windows of two
    neighbouring outputs) and has 2*O output channels with stride 2: at a
    3-wide kernel a third more multiplications, but a third less im2col
    copying and a wider matmul, about 15% faster at O = 16. Its (N, *out/2, 2*O)
    result is the (N, *out, O) channels-last memory of the conv's output.
    """
    out_channels, width = weight.shape[0], weight.shape[-1]
    paired = np.zeros((2, *weight.shape[:-1], width + 1), weight.dtype)
    paired[0, ..., :width] = weight  # the left output of a pair: the kernel's first `width` columns
    paired[1, ..., 1:] = weight  # the right one: shifted by one column
    pads = list(geometry.pads)
    pads[-1] += 1  # the wider kernel reaches one column further at the right edge
    wide = Geometry([*geometry.kernel[:-1], width + 1], [*geometry.strides[:-1], 2], pads, geometry.dilations)
    half = [*out[:-1], out[-1] // 2]
    batch = x.shape[0]
    if overwritable is not None and overwritable.shape == (batch, out_channels, *out) \
            and channels_last(overwritable).flags.c_contiguous:  # the same memory, seen as the paired conv's output
        overwritable = channels_last(overwritable).reshape(batch, *half, 2 * out_channels)
        overwritable = overwritable.transpose(0, -1, *range(1, len(out) + 1))
    else:
        overwritable = None

    def finish(block: np.ndarray, start: int) -> None:  # the same bytes, seen as the conv's own output
        epilogue(block.reshape(len(block), *out, out_channels), start)

    y = _im2col_matmul(x, paired.reshape(2 * out_channels, *paired.shape[2:]), 1, wide, half, finish, overwritable)
    return channels_last(y).reshape(batch, *out, out_channels).transpose(0, -1, *range(1, len(out) + 1))


def _depthwise(x: np.ndarray, weight: np.ndarray, geometry: Geometry, out: list[int]) -> np.ndarray:
    """Depthwise conv (O = C * m): y[n, c*m + j] = sum over taps k of w[c*m + j, k] * window_k(x)[n, c]."""
    batch, channels = x.shape[:2]
    view = geometry.windows(geometry.padder(x, batch, out)(x), out)
    multiplier = weight.shape[0] // channels
    taps = weight.reshape(channels, multiplier, -1, *[1] * len(out))
    y = np.zeros((batch, channels, multiplier, *out), np.result_type(x, weight))
    term = np.empty_like(y)
    for index, tap in enumerate(np.ndindex(*geometry.kernel)):
        np.multiply(view[(slice(None), slice(None)) + tap][:, :, None], taps[:, :, index], out=term)
        y += term
    return y


def batch_norm_affine(
    scale: np.ndarray, bias: np.ndarray, mean: np.ndarray, var: np.ndarray, epsilon: float
) -> tuple[np.ndarray, np.ndarray]:
    """(multiplier, offset) per channel with batch_norm(x) = x * multiplier + offset, computed in float64.

    The kernel and the folding pass both use this, so a folded graph differs
    from the unfolded one only by the rounding of the folded weights.
    """
    multiplier = scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + epsilon)
    offset = bias.astype(np.float64) - mean.astype(np.float64) * multiplier
    return multiplier.astype(np.float32), offset.astype(np.float32)


@register
class BatchNorm(Op):
    """Inference batch normalisation over channel axis 1 (ONNX BatchNormalization)."""

    name = "batch_norm"
    per_sample = True
    arity = (5, 5)
    defaults = {"epsilon": 1e-5}
    signature = "x (N, C, ...), scale, bias, mean, var (each (C,))"
    rule = "same shape as x"

    def shape_rule(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        x = tuple(inputs[0].shape)
        if len(x) < 2:
            raise ShapeError(f"batch_norm needs an (N, C, ...) input, got {x}")
        for role, spec in zip(("scale", "bias", "mean", "var"), inputs[1:]):
            check_vector("batch_norm", role, spec, x[1])
        return [(x, inputs[0].dtype)]

    def kernel(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        x = arrays[0]
        scale, bias, mean, var = arrays[1:]
        multiplier, offset = batch_norm_affine(scale, bias, mean, var, attrs["epsilon"])
        channel = (-1, *[1] * (x.ndim - 2))
        y = x * multiplier.reshape(channel)
        y += offset.reshape(channel)
        return [y]
