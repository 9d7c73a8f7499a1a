"""A float island's sums in one fixed order: the order the C target's float kernels add in.

A float32 sum's bits depend on the order of its terms, and numpy's matmul
(BLAS) and the interpreter's native conv add a dot product in blocks whose
order depends on the library and the machine. So the island ops whose results
are sums are computed here term by term, each product rounded to float32 and
then added, in the C kernels' loop order (and C is built with
-ffp-contract=off, so no multiply-add is fused):

- dense: 0, plus x[k] * w[k, o] for k ascending, then the bias;
- conv: 0, plus x * w for each input channel of the group, kernel row, kernel
  column (taps in the padding add nothing), then the bias;
- global_avg_pool, reduce_mean: 0, plus each reduced value in C order, then
  one division by their count (a float32).

2-D convs and dense layers run compiled where the native kernels load (`dabuild.ir.kernels.island`: the
same terms in the same order, so the same bits); the numpy loops below stay for the rest and as the
definition the compiled kernel is tested against.

Then the fused activation. Every other op an island holds gives the same
float32 whatever the order (elementwise arithmetic, max, clamps, copies), so
its IR kernel is used as it is. With the same quantize/dequantize at the
island's boundary, the C target's float path then matches the integer
reference bit for bit (`check:c` stays `exact`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from dabuild.ir.kernels.native import layer_thread_count, native_conv
from dabuild.ir.ops import OPS
from dabuild.ir.ops.activation import fused_activation
from dabuild.ir.ops.linear import conv_geometry
from dabuild.ir.ops.window import output_sizes
from dabuild.registry import Registry

OrderedKernel = Callable[[list[np.ndarray], dict[str, Any]], np.ndarray]
ORDERED: Registry[OrderedKernel] = Registry("ordered float op", "float islands (dabuild.quant.layers.island_order)")


def run_ordered(op: str, inputs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    """Op `op` on float32 `inputs` as the C float kernels compute it (see the module doc)."""
    kernel = ORDERED.get(op)
    if kernel is None:
        return OPS[op].run(inputs, attrs)
    return [kernel([np.asarray(x, np.float32) for x in inputs], OPS[op].resolve(attrs))]


def _with_bias(acc: np.ndarray, inputs: list[np.ndarray], axis: int, attrs: dict[str, Any]) -> np.ndarray:
    if len(inputs) > 2:
        shape = [1] * acc.ndim
        shape[axis] = -1
        acc += inputs[2].reshape(shape)
    return fused_activation(attrs)(acc)


@ORDERED.register("dense")
def _dense(inputs: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    x, weight = inputs[0], inputs[1]
    native = native_conv()
    if native is not None and weight.ndim == 2 and x.ndim >= 1:  # the rows of x as the 1x1 images of a conv
        rows = x.reshape(-1, weight.shape[0], 1, 1)
        sums = native.island.conv(rows, weight.T[:, :, None, None], 1, [1, 1], [0, 0], [1, 1], [1, 1],
                                  layer_thread_count())
        return _with_bias(sums.reshape(*x.shape[:-1], weight.shape[1]), inputs, -1, attrs)
    acc = np.zeros((*x.shape[:-1], weight.shape[1]), np.float32)
    for k in range(weight.shape[0]):
        acc += x[..., k:k + 1] * weight[k]
    return _with_bias(acc, inputs, -1, attrs)


@ORDERED.register("conv")
def _conv(inputs: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    x, weight = inputs[0], inputs[1]
    if x.ndim > 4:  # 3-D and more: no C float kernel runs them, so the IR's order serves
        return OPS["conv"].run(inputs, attrs)[0]
    if x.ndim == 3:  # 1-D: one row of a 2-D conv
        strides, pads, dilations = conv_geometry(attrs, 1)
        flat = {**attrs, "strides": [1, strides[0]], "pads": [0, pads[0], 0, pads[1]], "dilations": [1, dilations[0]]}
        return _conv([x[:, :, None], weight[:, :, None], *inputs[2:]], flat)[:, :, 0]
    strides, pads, dilations = conv_geometry(attrs, 2)
    kernel = list(weight.shape[2:])
    out = output_sizes(x.shape, kernel, strides, pads, dilations)
    native = native_conv()
    if native is not None:
        sums = native.island.conv(x, weight, attrs["groups"], strides, pads[:2], dilations, out, layer_thread_count())
        return _with_bias(sums, inputs, 1, attrs)
    padded = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    groups, per_group = attrs["groups"], weight.shape[1]
    channel_of = (np.arange(weight.shape[0]) // (weight.shape[0] // groups)) * per_group  # first input channel
    acc = np.zeros((x.shape[0], weight.shape[0], *out), np.float32)
    for c in range(per_group):
        source = padded[:, channel_of + c]
        for i in range(kernel[0]):
            for j in range(kernel[1]):
                top, left = i * dilations[0], j * dilations[1]
                tap = source[:, :, top:top + strides[0] * (out[0] - 1) + 1:strides[0],
                             left:left + strides[1] * (out[1] - 1) + 1:strides[1]]
                acc += tap * weight[:, c, i, j][None, :, None, None]
    return _with_bias(acc, inputs, 1, attrs)


def _mean(x: np.ndarray, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
    kept = [a for a in range(x.ndim) if a not in axes]
    moved = x.transpose(*kept, *axes).reshape(*(x.shape[a] for a in kept), -1)
    acc = np.zeros(moved.shape[:-1], np.float32)
    for k in range(moved.shape[-1]):
        acc += moved[..., k]
    acc /= np.float32(moved.shape[-1])
    return acc.reshape([1 if a in axes else x.shape[a] for a in range(x.ndim)]) if keepdims else acc


@ORDERED.register("global_avg_pool")
def _global_avg_pool(inputs: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    return _mean(inputs[0], tuple(range(2, inputs[0].ndim)), True)


@ORDERED.register("reduce_mean")
def _reduce_mean(inputs: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    x = inputs[0]
    return _mean(x, OPS["reduce_mean"].axes(x.ndim, attrs), bool(attrs["keepdims"]))  # type: ignore[attr-defined]
