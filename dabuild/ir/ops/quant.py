"""fake_quant: quantization given upstream, run in float (see `dabuild.ir.given` for the contract)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from dabuild.ir.given import OP, GivenQuant
from dabuild.ir.ops.base import REQUIRED, Op, OutputSpec, ShapeError, normalize_axis, register

if TYPE_CHECKING:
    from dabuild.ir.graph import TensorSpec


@register
class FakeQuant(Op):
    """x quantized to integers and back: the tensor as an upstream quantizer left it."""

    name = OP
    defaults = {"scale": REQUIRED, "zero_point": REQUIRED, "bits": REQUIRED, "signed": REQUIRED, "axis": None,
                "narrow": False, "rounding": "half_even"}
    rule = "same shape as x; (clip(round(x / scale) + zero_point, qmin, qmax) - zero_point) * scale"
    per_sample = True

    def shape_rule(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        try:
            given = GivenQuant.from_attrs(attrs)
        except (ValueError, TypeError) as error:
            raise ShapeError(f"fake_quant: {error}") from None
        shape = tuple(inputs[0].shape)
        if given.axis is not None:
            axis = normalize_axis(given.axis, len(shape), "fake_quant")
            if shape[axis] is not None and shape[axis] != len(given.scale):
                raise ShapeError(f"fake_quant: {len(given.scale)} scales along axis {axis} of size {shape[axis]}")
        return [(shape, inputs[0].dtype)]

    def kernel(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        return [GivenQuant.from_attrs(attrs).fake_quantize(arrays[0])]
