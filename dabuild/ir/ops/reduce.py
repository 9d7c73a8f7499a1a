"""Reductions over a set of axes: mean, sum, max."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from dabuild.ir.ops.base import Op, OutputSpec, normalize_axes, register

if TYPE_CHECKING:
    from dabuild.ir.graph import TensorSpec


class Reduce(Op):
    """Reduce `axes` (None or [] = all, as ONNX), keeping them as size 1 when `keepdims`."""

    defaults = {"axes": None, "keepdims": True}
    rule = "listed axes (None = all) become 1, or vanish without keepdims"
    reducer: ClassVar[Any]

    def samplewise(self, attrs: dict[str, Any]) -> bool:
        """Reducing listed axes other than the batch."""
        attrs = self.resolve(attrs)
        return bool(attrs["axes"]) and 0 not in attrs["axes"]

    def axes(self, rank: int, attrs: dict[str, Any]) -> tuple[int, ...]:
        if not attrs["axes"]:
            return tuple(range(rank))
        return tuple(normalize_axes(attrs["axes"], rank, self.name))

    def shape_rule(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        shape = tuple(inputs[0].shape)
        axes = self.axes(len(shape), attrs)
        if attrs["keepdims"]:
            return [(tuple(1 if a in axes else d for a, d in enumerate(shape)), inputs[0].dtype)]
        return [(tuple(d for a, d in enumerate(shape) if a not in axes), inputs[0].dtype)]

    def kernel(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        x = arrays[0]
        result = self.reducer(x, axis=self.axes(x.ndim, attrs), keepdims=bool(attrs["keepdims"]))
        return [np.asarray(result, x.dtype)]


@register
class ReduceMean(Reduce):
    name = "reduce_mean"
    reducer = staticmethod(np.mean)


@register
class ReduceSum(Reduce):
    name = "reduce_sum"
    reducer = staticmethod(np.sum)


def _max_or_minus_infinity(x: np.ndarray, axis: tuple[int, ...], keepdims: bool) -> np.ndarray:
    """The maximum, -inf over an empty set (as ONNX defines it; numpy's plain max refuses)."""
    return np.max(x, axis=axis, keepdims=keepdims, initial=-np.inf)


@register
class ReduceMax(Reduce):
    name = "reduce_max"
    reducer = staticmethod(_max_or_minus_infinity)
