"""What each activation is in integers: a clamp in the quantized domain, or a lookup table.

relu, relu6 and clip are clamps: with a tensor's params, their bounds are two
integers, exact up to the rounding of the bounds themselves. Every other
elementwise activation (leaky_relu, sigmoid, tanh, hard_sigmoid, hard_swish,
gelu) is a function of one integer value, so it becomes a table of its
results for every value of the input's dtype (256 for int8, 65536 for int16),
computed at quantize time with the float op of dabuild.ir.ops: exact by
construction, and one load per value in C.

A table needs the params of its input. When conv or dense has such an
activation fused, that input (the pre-activation) is a tensor of the QGraph
only, named `pre_activation(output)`; calibration observes it under that name
(dabuild.quant.calibrate splits the activation off for it).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dabuild.ir.ops import OPS, Activation
from dabuild.qir.qgraph import QuantParams

CLAMP_ACTIVATIONS = frozenset({"relu", "relu6", "clip"})


def is_table_activation(op: str) -> bool:
    return op not in CLAMP_ACTIVATIONS and isinstance(OPS.get(op), Activation)


def pre_activation(tensor: str) -> str:
    """The name of the tensor a fused table activation reads."""
    return f"{tensor}:pre_activation"


def clamp_bounds(op: str, attrs: dict[str, Any], params: QuantParams) -> tuple[int, int]:
    """[low, high] of a clamp activation ("none" too: the dtype's range) in the quantized domain of `params`."""
    real = {"none": (None, None), "relu": (0.0, None), "relu6": (0.0, 6.0)}
    low, high = real[op] if op in real else (attrs.get("min"), attrs.get("max"))

    def bound(value: float | None, default: int) -> int:
        return default if value is None else int(params.quantize(np.float32(value)))

    return bound(low, params.qmin), bound(high, params.qmax)


def lookup_table(op: str, attrs: dict[str, Any], source: QuantParams, target: QuantParams) -> np.ndarray:
    """table[q - qmin] = quantize(op(dequantize(q))) for every q of the source dtype."""
    real = source.dequantize(source.all_values())
    return target.quantize(OPS[op].run([real], attrs)[0])
