"""Identity and the broadcasting binary arithmetic ops."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from dabuild.ir.ops.base import Kernel, Op, OutputSpec, broadcast_shapes, fits, register

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
