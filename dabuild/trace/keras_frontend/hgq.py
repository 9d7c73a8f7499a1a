"""HGQ2's quantized layers (the `hgq2` package) as given quantization.

An HGQ2 layer is a Keras layer with quantizers around it: an input quantizer
(`iq`), a kernel and a bias quantizer (the layer computes with `qkernel` and
`qbias`, already on their grids), and optionally an output quantizer (`oq`).
Each quantizer is fixed point with a sign bit k, integer bits i and fractional
bits f, per tensor or per element, a rounding mode and an overflow mode. What
lies between two quantizers HGQ2 computes exactly (an accumulator at its full
width, a relu of it), as da4ml's own conversion of the model does.

The converters here wrap the float converters of `layers`: each activation
quantizer becomes a `fixed_quant` node (`dabuild.ir.given_quant.FixedQuant`: k, i, f
per element in the IR's layout, rounding and overflow by name: RND half_up,
TRN floor, RND_CONV half_even, RND_INF half_away, TRN_ZERO to_zero; WRAP, SAT,
SAT_SYM), which also makes every tensor between quantizers exact downstream.
The kernel is the quantized kernel with a `fake_quant` over it on one
power-of-two grid fine enough for its values and for the bias (the bias must
lie on the accumulator's grid, input step x kernel step), so the given
integers are kept exactly; the float converter does the layer's arithmetic.
QKeras-style quantizers (HGQ2's `kbi` type: keep_negative, bits, integer) are
the same fixed-point quantizers and map the same way.

Refused, naming the layer, the quantizer and the nearest choice HGQ2 offers:
scalers and affine maps, float quantizers, rounding RND_ZERO/RND_MIN_INF and
overflow WRAP_SM.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dabuild.ir.given_quant import FIXED_OP, FixedQuant
from dabuild.trace.keras_frontend import layers
from dabuild.trace.keras_frontend.walk import CONVERTERS, Builder, Call, Unsupported, Value, converts

# HGQ2's rounding and overflow modes under the names of dabuild's given quantization (dabuild.ir.given_quant)
ROUNDINGS = {"RND": "half_up", "TRN": "floor", "RND_CONV": "half_even", "RND_INF": "half_away", "TRN_ZERO": "to_zero"}
OVERFLOWS = {"WRAP": "wrap", "SAT": "saturate", "SAT_SYM": "saturate_symmetric"}


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

    def fixed(self, what: str, channels_first: bool = False) -> FixedQuant:
        """The fixed_quant (dabuild.ir.given_quant's contract) of this quantizer, over the IR layout (channels first
        moves Keras's last axis to the front); Unsupported for modes the contract has no name for."""
        mode = self.round_mode.upper().removeprefix("S_")  # stochastic rounding is training-time only
        if mode not in ROUNDINGS:
            raise Unsupported(f"{what}: round_mode {self.round_mode!r}, for which dabuild has no rounding; nearest "
                              "choice: round_mode 'RND' (half up)")
        if self.overflow_mode.upper() not in OVERFLOWS:
            raise Unsupported(f"{what}: overflow_mode {self.overflow_mode!r}; nearest choice: overflow_mode 'WRAP' "
                              "or 'SAT'")
        k, i, f = (np.asarray(a) for a in (self.k, self.i, self.f))
        if channels_first and k.ndim > 1:
            k, i, f = (np.moveaxis(a, -1, 0) for a in (k, i, f))
        return FixedQuant.of(k, i, f, ROUNDINGS[mode], OVERFLOWS[self.overflow_mode.upper()])


def weight_grid(values: np.ndarray, what: str, finest: float | None = None) -> dict[str, Any]:
    """fake_quant attributes holding already quantized `values` exactly: the finest power-of-two step they use
    (or `finest`, where that is finer: a bias on a finer grid than input x kernel steps needs it), and the
    fewest signed bits for their integers (per-element kernel widths all fit one such grid)."""
    values = np.asarray(values, dtype=np.float64)
    scale = grid_step(values, what)
    if finest is not None:
        scale = min(scale, finest)
    integers = values / scale
    bits = max(int(np.max(integers, initial=0)).bit_length(), int(-np.min(integers, initial=0) - 1).bit_length()) + 1
    return {"scale": [scale], "zero_point": [0], "bits": max(bits, 2), "signed": True, "axis": None,
            "narrow": False, "rounding": "half_even"}


def grid_step(values: np.ndarray, what: str) -> float:
    """The coarsest power-of-two step on which every value lies (1 for all zeros)."""
    values = np.asarray(values, dtype=np.float64)
    if not np.any(values):
        return 1.0
    for fractional in range(-32, 64):
        integers = values * 2.0**fractional
        if np.array_equal(integers, np.rint(integers)):
            return 2.0**-fractional
    raise Unsupported(f"{what}: values on no power-of-two grid")


def fixed_quant(b: Builder, x: Value, quantizer: FixedQuantizer, what: str) -> Value:
    """A fixed_quant node over `x`, its types laid out as x is."""
    return b.value(FIXED_OP, [x.name], quantizer.fixed(what, x.channels_first).attrs(), x.channels_first)


def _sample_shape(b: Builder, x: Value) -> tuple[int, ...]:
    """x's per-sample shape in Keras's layout (what HGQ2's quantizers broadcast over)."""
    shape = b.sizes(x)
    if x.channels_first and x.rank > 2:
        shape = (*shape[1:], shape[0])
    return shape


def quantize_input(b: Builder, x: Value, quantizer: Any, what: str) -> tuple[Value, float]:
    """x through a fixed_quant of `quantizer`, and the step 2**-F of its grid."""
    fixed = FixedQuantizer.of(quantizer, _sample_shape(b, x), what)
    return fixed_quant(b, x, fixed, what), 2.0 ** -fixed.fixed(what).fractional_bits


def hgq_layer(convert: Callable[[Builder, Call], Value]) -> Callable[[Builder, Call], Value]:
    """The HGQ2 converter of a layer the float converter `convert` maps: quantizers around it."""
    def converter(b: Builder, call: Call) -> Value:
        layer = call.layer
        inputs, steps = list(call.inputs), []
        if layer.enable_iq:
            quantizers = getattr(layer.iq, "quantizers", None) or [layer.iq]
            quantized = [quantize_input(b, x, q, f"input quantizer {n}" if len(inputs) > 1 else "input quantizer")
                         for n, (x, q) in enumerate(zip(inputs, quantizers))]
            inputs, steps = [x for x, _ in quantized], [step for _, step in quantized]
        parameters = {}
        if getattr(layer, "kernel", None) is not None and hasattr(layer, "qkernel"):
            parameters["kernel"] = _numpy(layer.qkernel)
            finest = None
            if getattr(layer, "bias", None) is not None:
                parameters["bias"] = _numpy(layer.qbias)
                if len(steps) == 1:  # the accumulator's grid (input x kernel steps) must hold the bias exactly
                    finest = grid_step(parameters["bias"], "bias") / steps[0]
            b.given_weights = {"kernel": weight_grid(parameters["kernel"], "kernel", finest)}
        try:
            y = convert(b, Call(layer, inputs, call.args, call.kwargs, parameters))
        finally:
            b.given_weights = {}
        if getattr(layer, "enable_oq", False):
            y, _ = quantize_input(b, y, layer.oq, "output quantizer")
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


def _emits(convert: Callable[[Builder, Call], Value]) -> tuple[str, ...]:
    """What the plain layer's converter declares, and the quantizers this wrapper puts around it."""
    return (*next(entry.emits for entry in CONVERTERS.values() if entry.convert is convert), FIXED_OP)


for _name, _convert in _QUANTIZED.items():
    converts(_name, emits=_emits(_convert))(hgq_layer(_convert))


@converts("Quantizer", emits=(FIXED_OP,))
def quantizer_layer(b: Builder, call: Call) -> Value:
    """HGQ2's stand-alone Quantizer layer (e.g. the model's input quantizer)."""
    return quantize_input(b, call.inputs[0], call.layer, "quantizer")[0]
