"""HGQ2's quantized layers (the `hgq2` package) as given quantization.

An HGQ2 layer is a Keras layer with quantizers around it: an input quantizer
(`iq`), a kernel and a bias quantizer (the layer computes with `qkernel` and
`qbias`, already on their grids), and optionally an output quantizer (`oq`).
Each quantizer is fixed point with a sign bit k, integer bits i and fractional
bits f, per tensor or per element, a rounding mode and an overflow mode.

The converters here wrap the float converters of `layers`: the input quantizer
becomes a `fake_quant` node over the layer's input, the kernel is the quantized
kernel with a `fake_quant` over it (its grid: one power-of-two scale, enough
bits for its values, so the integers are kept exactly), the float converter
does the layer's arithmetic and activation, and the output quantizer becomes a
`fake_quant` over its output. The fake_quant attributes are the contract of
dabuild's given quantization (`dabuild.ir.given`): scale 2**-f, zero point 0,
k + i + f bits, signed when k = 1, narrow for SAT_SYM, rounding by name.

What that contract cannot state is refused naming the layer, the quantizer, the
parameter and the nearest choice HGQ2 offers: per-element widths (HGQ2's
default for activations), overflow WRAP (HGQ2's default for activations: the
contract saturates), rounding modes it has no name for (RND, HGQ2's default, is
round half up), scalers and affine quantizers, float quantizers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dabuild.trace.keras_frontend import layers
from dabuild.trace.keras_frontend.walk import Builder, Call, Unsupported, Value, converts

# HGQ2's rounding modes under the names of dabuild's given quantization (dabuild.ir.given.ROUNDINGS)
ROUNDINGS = {"RND_CONV": "half_even", "RND_INF": "half_away", "TRN": "floor", "TRN_ZERO": "to_zero"}
OVERFLOWS = ("SAT", "SAT_SYM")
GIVEN_OP = "fake_quant"


def _numpy(value: Any) -> np.ndarray:
    import keras

    return np.asarray(keras.ops.convert_to_numpy(value))


@dataclass(frozen=True)
class FixedQuantizer:
    """One HGQ2 fixed-point quantizer over a tensor: k, i, f per element (broadcast), and its modes."""

    k: np.ndarray
    i: np.ndarray
    f: np.ndarray
    round_mode: str
    overflow_mode: str

    @classmethod
    def of(cls, quantizer: Any, shape: tuple[int, ...], what: str) -> FixedQuantizer:
        """The fixed-point quantizer an HGQ2 `Quantizer` applies to tensors of per-sample `shape`."""
        from hgq.quantizer.internal import FixedPointQuantizerBase

        if getattr(quantizer, "scaler", None) is not None or getattr(quantizer, "affine", None):
            raise Unsupported(f"{what}: a quantizer with a scaler or an affine map; nearest choice: a plain "
                              "fixed-point quantizer")
        inner = quantizer.quantizer
        if not isinstance(inner, FixedPointQuantizerBase):
            raise Unsupported(f"{what}: {type(inner).__name__} (not fixed point); nearest choice: q_type 'kif' or "
                              "'kbi'")
        batched = (1, *shape)
        k, i, f = (_numpy(inner.bw_mapper.bw_to_x(value, batched))[0] for value in inner.kif)
        return cls(np.rint(k).astype(np.int64), np.rint(i).astype(np.int64), np.rint(f).astype(np.int64),
                   inner.round_mode, inner.overflow_mode)

    def quantize(self, x: np.ndarray) -> np.ndarray:
        """x on this quantizer's grid, as HGQ2 computes it (numpy; batch axis first)."""
        from quantizers.fixed_point.fixed_point_ops_np import get_fixed_quantizer_np

        return get_fixed_quantizer_np(self.round_mode, self.overflow_mode)(x, self.k, self.i, self.f)

    def given(self, what: str) -> dict[str, Any]:
        """The fake_quant attributes (dabuild.ir.given's contract) of this quantizer; Unsupported if none fit."""
        triples = {(int(k), int(i), int(f)) for k, i, f in
                   zip(*(np.broadcast_arrays(self.k, self.i, self.f)[n].ravel() for n in range(3)))}
        if len(triples) > 1:
            k, i, f = (int(np.max(v)) for v in (self.k, self.i, self.f))
            raise Unsupported(f"{what}: per-element bit widths ({len(triples)} distinct (k, i, f)); dabuild's given "
                              "quantization has one type per tensor or channel; nearest choice: a quantizer with "
                              f"heterogeneous_axis=() (the widest here is k={k} i={i} f={f})")
        (k, i, f), = triples
        if self.round_mode not in ROUNDINGS:
            raise Unsupported(f"{what}: round_mode {self.round_mode!r}, for which dabuild has no rounding (RND is "
                              "round half up); nearest choice: round_mode 'RND_CONV' (half to even)")
        if self.overflow_mode not in OVERFLOWS:
            raise Unsupported(f"{what}: overflow_mode {self.overflow_mode!r}; dabuild's given quantization saturates; "
                              "nearest choice: overflow_mode 'SAT'")
        if k + i + f < 1:
            raise Unsupported(f"{what}: {k + i + f} bits (the tensor is pruned to 0); nearest choice: 1 bit")
        return {"scale": [2.0 ** -f], "zero_point": [0], "bits": k + i + f, "signed": bool(k), "axis": None,
                "narrow": self.overflow_mode == "SAT_SYM", "rounding": ROUNDINGS[self.round_mode]}


def weight_grid(values: np.ndarray, what: str) -> dict[str, Any]:
    """fake_quant attributes holding already quantized `values` exactly: the finest power-of-two step they use,
    and the fewest signed bits for their integers (per-element kernel widths all fit one such grid)."""
    values = np.asarray(values, dtype=np.float64)
    if not np.any(values):
        return {"scale": [1.0], "zero_point": [0], "bits": 2, "signed": True, "axis": None, "narrow": False,
                "rounding": "half_even"}
    for fractional in range(-32, 64):  # the coarsest power-of-two grid holding every value
        integers = values * 2.0**fractional
        if np.array_equal(integers, np.rint(integers)):
            break
    else:
        raise Unsupported(f"{what}: values on no power-of-two grid")
    scale = 2.0**-fractional
    bits = max(int(np.max(integers)).bit_length(), int(-np.min(integers) - 1).bit_length()) + 1
    return {"scale": [scale], "zero_point": [0], "bits": bits, "signed": True, "axis": None, "narrow": False,
            "rounding": "half_even"}


def fake_quant_available(b: Builder) -> None:
    from dabuild.ir.ops import OPS

    if GIVEN_OP not in OPS:
        raise Unsupported(f"HGQ2 quantizers need dabuild's given quantization (IR op {GIVEN_OP!r}), which this "
                          "dabuild does not have")


def fake_quant(b: Builder, x: Value, attrs: dict[str, Any], what: str) -> Value:
    """A fake_quant node over `x` (either layout: the parameters are per tensor)."""
    return b.value(GIVEN_OP, [x.name], attrs, x.channels_first)


def _sample_shape(b: Builder, x: Value) -> tuple[int, ...]:
    """x's per-sample shape in Keras's layout (what HGQ2's quantizers broadcast over)."""
    shape = b.sizes(x)
    if x.channels_first and x.rank > 2:
        shape = (*shape[1:], shape[0])
    return shape


def quantize_input(b: Builder, layer: Any, x: Value, quantizer: Any, what: str) -> Value:
    return fake_quant(b, x, FixedQuantizer.of(quantizer, _sample_shape(b, x), what).given(what), what)


def hgq_layer(convert: Callable[[Builder, Call], Value]) -> Callable[[Builder, Call], Value]:
    """The HGQ2 converter of a layer the float converter `convert` maps: quantizers around it."""
    def converter(b: Builder, call: Call) -> Value:
        layer = call.layer
        fake_quant_available(b)
        inputs = list(call.inputs)
        if layer.enable_iq:
            quantizers = getattr(layer.iq, "quantizers", None) or [layer.iq]
            inputs = [quantize_input(b, layer, x, q, f"input quantizer {n}" if len(inputs) > 1 else "input quantizer")
                      for n, (x, q) in enumerate(zip(inputs, quantizers))]
        parameters = {}
        if getattr(layer, "kernel", None) is not None and hasattr(layer, "qkernel"):
            parameters["kernel"] = _numpy(layer.qkernel)
            if getattr(layer, "bias", None) is not None:
                parameters["bias"] = _numpy(layer.qbias)
        b.given_weights = {"kernel": weight_grid(parameters["kernel"], "kernel")} if "kernel" in parameters else {}
        try:
            y = convert(b, Call(layer, inputs, call.args, call.kwargs, parameters))
        finally:
            b.given_weights = {}
        if getattr(layer, "enable_oq", False):
            y = quantize_input(b, layer, y, layer.oq, "output quantizer")
        return y

    converter.__doc__ = f"HGQ2's form of: {convert.__doc__ or convert.__name__}"
    return converter


_QUANTIZED = {
    "QDense": layers.dense, "QEinsumDense": layers.einsum_dense,
    "QConv1D": layers.conv, "QConv2D": layers.conv, "QConv3D": layers.conv,
    "QAdd": layers.add, "QSubtract": layers.subtract, "QMultiply": layers.multiply,
    "QMaxPool1D": layers.max_pool, "QMaxPool2D": layers.max_pool, "QMaxPooling1D": layers.max_pool,
    "QMaxPooling2D": layers.max_pool, "QAvgPool1D": layers.avg_pool, "QAvgPool2D": layers.avg_pool,
    "QAveragePooling1D": layers.avg_pool, "QAveragePooling2D": layers.avg_pool,
    "QGlobalAveragePooling1D": layers.global_avg_pool, "QGlobalAveragePooling2D": layers.global_avg_pool,
    "QGlobalAvgPool1D": layers.global_avg_pool, "QGlobalAvgPool2D": layers.global_avg_pool,
    "QGlobalMaxPooling1D": layers.global_max_pool, "QGlobalMaxPooling2D": layers.global_max_pool,
    "QGlobalMaxPool1D": layers.global_max_pool, "QGlobalMaxPool2D": layers.global_max_pool,
}
for _name, _convert in _QUANTIZED.items():
    converts(_name)(hgq_layer(_convert))


@converts("Quantizer")
def quantizer_layer(b: Builder, call: Call) -> Value:
    """HGQ2's stand-alone Quantizer layer (e.g. the model's input quantizer)."""
    fake_quant_available(b)
    return quantize_input(b, call.layer, call.inputs[0], call.layer, "quantizer")
