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

- matmul of two tensors (or a tensor and a constant): 0, plus a[i, t] *
  b[t, j] for t ascending, per matrix of the broadcast batch;
- avg_pool: 0, plus each tap in kernel row, column order (the padding adds
  nothing), then one division by the window's count;
- softmax: per row along the axis, e = exp(x - max), their sum from 0 in
  index order, then each e divided by it.

The transcendentals are the C kernels' own too, not numpy's or libm's
(whose last bits differ between libraries): exp is Cephes' expf, tanh
Cephes' tanhf, sigmoid 1 / (1 + exp(-x)), erf Abramowitz & Stegun 7.1.26 with
that exp, each a fixed sequence of float32 operations (`expf32` and the rest,
mirrored in dabuild_kernels.h), within a few ulp of the IR ops' values.

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

import math
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
ORDERED: Registry[OrderedKernel] = Registry("ordered float op", "float islands (dabuild.qir.layers.island_order)")


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
    name = attrs.get("activation", "none")
    if name in TRANSCENDENTAL:  # the C kernels' own exp, tanh, ...
        return TRANSCENDENTAL[name](acc, OPS[name].resolve(attrs.get("activation_attrs") or {}))
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


# ---------------------------------------------------------------- transcendentals as the C kernels compute them

F32 = np.float32


def _pow2(n: np.ndarray) -> np.ndarray:
    return ((n.astype(np.int64) + 127).astype(np.uint32) << np.uint32(23)).view(np.float32)


def expf32(x: np.ndarray) -> np.ndarray:
    """e**x as dabuild_expf computes it in C (Cephes' expf, float32 step by step; see the module doc)."""
    x = np.asarray(x, np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        safe = np.where((x > F32(88.72283935546875)) | (x < F32(-87.0)) | np.isnan(x), F32(0), x)
        t = safe * F32(1.44269502162933349609375)
        t = np.where(t >= 0, t + F32(0.5), t - F32(0.5))
        n = np.trunc(t).astype(np.int32)
        nf = n.astype(np.float32)
        r = safe - nf * F32(0.693359375)
        r = r - nf * F32(-2.12194440e-4)
        z = r * r
        p = np.full_like(r, F32(1.9875691500e-4))
        for c in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
            p = p * r + F32(c)
        y = p * z
        y = y + r
        y = y + F32(1.0)
        y = np.where(n > 127, y * F32(2.0), y)
        y = y * _pow2(np.minimum(n, 127))
    y = np.where(x > F32(88.72283935546875), F32(np.inf), np.where(x < F32(-87.0), F32(0), y))
    return np.where(np.isnan(x), x, y).astype(np.float32)


def tanhf32(x: np.ndarray) -> np.ndarray:
    """tanh as dabuild_tanhf computes it (Cephes' tanhf)."""
    x = np.asarray(x, np.float32)
    a = np.abs(x)
    z = x * x
    p = np.full_like(z, F32(-5.70498872745e-3))
    for c in (2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1, -3.33332819422e-1):
        p = p * z + F32(c)
    small = p * z * x + x
    with np.errstate(over="ignore"):
        large = F32(1.0) - F32(2.0) / (expf32(a + a) + F32(1.0))
    return np.where(a < F32(0.625), small, np.where(x < 0, -large, large)).astype(np.float32)


def sigmoidf32(x: np.ndarray) -> np.ndarray:
    """1 / (1 + e**-x) as dabuild_sigmoidf computes it."""
    with np.errstate(over="ignore"):
        return (F32(1.0) / (F32(1.0) + expf32(-np.asarray(x, np.float32)))).astype(np.float32)


def erff32(x: np.ndarray) -> np.ndarray:
    """erf as dabuild_erff computes it: the IR's Abramowitz & Stegun 7.1.26 with expf32."""
    x = np.asarray(x, np.float32)
    a = np.abs(x)
    t = F32(1.0) / (F32(1.0) + F32(0.3275911) * a)
    p = np.full_like(t, F32(1.061405429))
    for c in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
        p = p * t + F32(c)
    p = p * t
    y = F32(1.0) - p * expf32(-(a * a))
    return np.where(x < 0, -y, y).astype(np.float32)


def gelu32(x: np.ndarray, approximate: str) -> np.ndarray:
    """GELU as the C float kernel computes it, in the IR op's order of operations."""
    x = np.asarray(x, np.float32)
    if approximate == "tanh":
        cubic = F32(0.044715) * x * x * x
        inner = tanhf32(F32(math.sqrt(2 / math.pi)) * (x + cubic))
    else:
        inner = erff32(x * F32(1 / math.sqrt(2)))
    return x * ((inner + F32(1.0)) * F32(0.5))


TRANSCENDENTAL: dict[str, Callable[[np.ndarray, dict[str, Any]], np.ndarray]] = {
    "exp": lambda x, attrs: expf32(x),
    "tanh": lambda x, attrs: tanhf32(x),
    "sigmoid": lambda x, attrs: sigmoidf32(x),
    "erf": lambda x, attrs: erff32(x),
    "gelu": lambda x, attrs: gelu32(x, attrs["approximate"]),
}

for _op, _function in TRANSCENDENTAL.items():
    ORDERED.register(_op)((lambda function: lambda inputs, attrs: function(inputs[0], attrs))(_function))


@ORDERED.register("softmax")
def _softmax(inputs: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    x = np.moveaxis(inputs[0], attrs["axis"], -1)
    e = expf32(x - x.max(axis=-1, keepdims=True))
    total = np.zeros(e.shape[:-1] + (1,), np.float32)
    for k in range(e.shape[-1]):
        total += e[..., k:k + 1]
    return np.moveaxis(e / total, -1, attrs["axis"])


@ORDERED.register("matmul")
def _matmul(inputs: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    a, b = inputs
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    acc = np.zeros(np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2]) + (a2.shape[-2], b2.shape[-1]), np.float32)
    for t in range(a2.shape[-1]):
        acc += a2[..., :, t:t + 1] * b2[..., t:t + 1, :]
    if a.ndim == 1:
        acc = acc[..., 0, :]
    return acc[..., 0] if b.ndim == 1 else acc


@ORDERED.register("avg_pool")
def _avg_pool(inputs: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    x = inputs[0]
    pool = OPS["avg_pool"]
    taps, _out = pool.tap_views(x, attrs, 0.0)  # type: ignore[attr-defined]  # Pool's, not every Op's
    acc = np.zeros(taps[0].shape, np.float32)
    for tap in taps:
        acc += tap
    return acc / pool.divisors(x.shape, attrs)  # type: ignore[attr-defined]
