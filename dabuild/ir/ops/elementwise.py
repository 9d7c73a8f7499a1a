"""Identity, the broadcasting binary arithmetic ops (add, sub, mul, div, max, min), prelu and where."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from dabuild.ir.ops.base import Kernel, Op, OutputSpec, ShapeError, broadcast_shapes, fits, register

if TYPE_CHECKING:
    from dabuild.ir.graph import TensorSpec


@register
class Identity(Op):
    name = "identity"
    per_sample = True

    def shape_rule(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        return [(tuple(inputs[0].shape), inputs[0].dtype)]

    def kernel(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        return [arrays[0]]


class Binary(Op):
    """Two inputs broadcast against each other, as numpy does."""

    per_sample = True

    arity = (2, 2)
    in_place = (0, 1)
    signature = "a, b"
    rule = "numpy broadcast of a and b"
    ufunc: ClassVar[np.ufunc]

    def shape_rule(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        return [(broadcast_shapes(inputs[0].shape, inputs[1].shape), inputs[0].dtype)]

    def kernel(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        return [self.ufunc(arrays[0], arrays[1])]

    def prepare(self, attrs: dict[str, Any]) -> Kernel:
        self.resolve(attrs)
        ufunc = self.ufunc

        def binary(arrays: list[np.ndarray], out: np.ndarray | None) -> list[np.ndarray]:
            a, b = arrays
            return [ufunc(a, b, out=fits(out, np.broadcast_shapes(a.shape, b.shape), np.result_type(a, b)))]

        return binary


@register
class Add(Binary):
    name = "add"
    ufunc = np.add


@register
class Sub(Binary):
    name = "sub"
    ufunc = np.subtract


@register
class Mul(Binary):
    name = "mul"
    ufunc = np.multiply


@register
class Div(Binary):
    name = "div"
    ufunc = np.true_divide


@register
class Max(Binary):
    """Elementwise maximum of two tensors (ONNX Max of many inputs becomes a chain of these)."""

    name = "max"
    ufunc = np.maximum


@register
class Min(Binary):
    """Elementwise minimum of two tensors (ONNX Min of many inputs becomes a chain of these)."""

    name = "min"
    ufunc = np.minimum


@register
class Prelu(Op):
    """x where x >= 0, else slope * x; slope broadcasts against x (one slope per channel: shape (C, 1, ...))."""

    name = "prelu"
    per_sample = True
    arity = (2, 2)
    signature = "x, slope"
    rule = "numpy broadcast of x and slope (must be x's shape)"

    def shape_rule(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        shape = broadcast_shapes(inputs[0].shape, inputs[1].shape)
        if len(shape) != len(inputs[0].shape) or any(
                a is not None and a != b for a, b in zip(inputs[0].shape, shape)):
            raise ShapeError(f"prelu slope {inputs[1].shape} must broadcast to x's shape {inputs[0].shape}")
        return [(tuple(inputs[0].shape), inputs[0].dtype)]

    def kernel(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        x, slope = arrays
        return [np.where(x >= 0, x, x * slope).astype(x.dtype, copy=False)]


@register
class Where(Op):
    """x where condition else y, all three broadcast (ONNX Where); the frontends require a constant condition."""

    name = "where"
    per_sample = True
    arity = (3, 3)
    signature = "condition, x, y"
    rule = "numpy broadcast of condition, x and y"

    def shape_rule(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        return [(broadcast_shapes(*(spec.shape for spec in inputs)), inputs[1].dtype)]

    def kernel(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        condition, x, y = arrays
        return [np.where(condition.astype(bool), x, y).astype(np.result_type(x, y), copy=False)]
