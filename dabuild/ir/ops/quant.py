"""fake_quant and fixed_quant: quantization given upstream, run in float (see `dabuild.ir.given_quant` for the contract)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from dabuild.ir.given_quant import FIXED_OP, OP, FixedQuant, GivenQuant
from dabuild.ir.ops.base import REQUIRED, Op, OutputSpec, ShapeError, normalize_axis, register

if TYPE_CHECKING:
    from dabuild.ir.graph import TensorSpec


@register
class FakeQuant(Op):
    """x quantized to integers and back: the tensor as an upstream quantizer left it."""

    name = OP
    defaults = {"scale": REQUIRED, "zero_point": REQUIRED, "bits": REQUIRED, "signed": REQUIRED, "axis": None,
                "narrow": False, "rounding": "half_even", "block_size": 0, "scale_shape": None}
    rule = ("same shape as x; (clip(round(x / scale) + zero_point, qmin, qmax) - zero_point) * scale; blocked: "
            "scale_shape's block along axis per block_size elements")
    per_sample = True

    def shape_rule(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        try:
            given = GivenQuant.from_attrs(attrs)
        except (ValueError, TypeError) as error:
            raise ShapeError(f"fake_quant: {error}") from None
        shape = tuple(inputs[0].shape)
        if given.blocked and given.axis is not None:  # GivenQuant makes a blocked record name its axis
            axis = normalize_axis(given.axis, len(shape), "fake_quant")
            expected = tuple(None if size is None else -(-size // given.block_size) if index == axis else size
                             for index, size in enumerate(shape))
            if len(given.scale_shape) != len(shape) or any(
                    size is not None and size != blocks for size, blocks in zip(expected, given.scale_shape)):
                raise ShapeError(f"fake_quant: scales of shape {list(given.scale_shape)} do not block a tensor of "
                                 f"shape {list(shape)} by {given.block_size} along axis {axis}")
        elif given.axis is not None:
            axis = normalize_axis(given.axis, len(shape), "fake_quant")
            if shape[axis] is not None and shape[axis] != len(given.scale):
                raise ShapeError(f"fake_quant: {len(given.scale)} scales along axis {axis} of size {shape[axis]}")
        return [(shape, inputs[0].dtype)]

    def kernel(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        return [GivenQuant.from_attrs(attrs).fake_quantize(arrays[0])]


@register
class FixedQuantOp(Op):
    """x on a fixed-point grid with a type per element: HGQ2's quantizer (see `dabuild.ir.given_quant.FixedQuant`)."""

    name = FIXED_OP
    defaults = {"k": REQUIRED, "i": REQUIRED, "f": REQUIRED, "shape": (), "rounding": "half_up", "overflow": "wrap"}
    rule = ("same shape as x; per element q = round(x * 2**f), wrapped or saturated into [-k 2**(i+f), "
            "2**(i+f) - 1], times 2**-f")
    per_sample = True

    def shape_rule(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        try:
            quant = FixedQuant.from_attrs(attrs)
        except (ValueError, TypeError, KeyError) as error:
            raise ShapeError(f"fixed_quant: {error}") from None
        shape = tuple(inputs[0].shape)
        sample = shape[1:]
        if quant.shape and (len(quant.shape) > len(sample) or any(
                s is not None and q not in (1, s) for q, s in zip(quant.shape[::-1], sample[::-1]))):
            raise ShapeError(f"fixed_quant: types of shape {list(quant.shape)} do not broadcast to the sample "
                             f"shape {list(sample)}")
        return [(shape, inputs[0].dtype)]

    def kernel(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        return [FixedQuant.from_attrs(attrs).quantize(arrays[0])]
