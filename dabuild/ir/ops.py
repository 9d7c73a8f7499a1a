"""The op set: one small class per op, holding its shape rule and its numpy kernel.

Adding an op means writing one class here and decorating it with `@register`;
shape inference, the interpreter and serialisation pick it up from `OPS`.
Shapes may contain `None` for a dynamic dimension (the batch); kernels follow
numpy's broadcasting semantics and compute in float32.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

if TYPE_CHECKING:
    from dabuild.ir.graph import TensorSpec

Shape = tuple["int | None", ...]
OutputSpec = tuple[Shape, str]  # (shape, dtype) of one output


class ShapeError(ValueError):
    """An op's inputs do not fit its shape rule; the graph adds which node it was."""


class Op(ABC):
    """Base of every op: `infer` maps input specs to output specs, `run` maps arrays to arrays."""

    name: ClassVar[str]
    arity: ClassVar[tuple[int, int]] = (1, 1)  # fewest and most inputs accepted

    @abstractmethod
    def infer(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        """(shape, dtype) of each output; ShapeError if the inputs do not fit."""

    @abstractmethod
    def run(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        """The outputs computed from the input arrays."""

    def check_arity(self, count: int) -> None:
        low, high = self.arity
        if not low <= count <= high:
            expected = str(low) if low == high else f"{low} to {high}"
            raise ShapeError(f"{self.name} takes {expected} inputs, got {count}")


OPS: dict[str, Op] = {}


def register(cls: type[Op]) -> type[Op]:
    """Class decorator adding one instance of the op to `OPS` under `cls.name`."""
    OPS[cls.name] = cls()
    return cls


def broadcast_shapes(*shapes: Shape) -> Shape:
    """numpy broadcasting over shapes that may hold None (a dynamic size that is not 1)."""
    rank = max(len(s) for s in shapes)
    result: list[int | None] = []
    for axis in range(rank):
        dims = [s[axis - rank + len(s)] for s in shapes if axis - rank + len(s) >= 0]
        known = {d for d in dims if d is not None and d != 1}
        if len(known) > 1:
            raise ShapeError(f"shapes {', '.join(map(str, shapes))} do not broadcast")
        if known:
            result.append(known.pop())
        elif None in dims:
            result.append(None)
        else:
            result.append(1)
    return tuple(result)


def _dims_agree(a: int | None, b: int | None) -> bool:
    return a is None or b is None or a == b


# ---------------------------------------------------------------- elementwise


class Unary(Op):
    """One input, one output of the same shape."""

    def infer(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        return [(tuple(inputs[0].shape), inputs[0].dtype)]


@register
class Identity(Unary):
    name = "identity"

    def run(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        return [arrays[0]]


@register
class Relu(Unary):
    name = "relu"

    def run(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        return [np.maximum(arrays[0], np.zeros((), arrays[0].dtype))]


@register
class Softmax(Unary):
    """Softmax along `attrs["axis"]` (default -1), shifted by the max for stability."""

    name = "softmax"

    def infer(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        axis = attrs.get("axis", -1)
        if not -len(inputs[0].shape) <= axis < len(inputs[0].shape):
            raise ShapeError(f"softmax axis {axis} is out of range for shape {inputs[0].shape}")
        return super().infer(inputs, attrs)

    def run(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        axis = attrs.get("axis", -1)
        shifted = np.exp(arrays[0] - arrays[0].max(axis=axis, keepdims=True))
        return [shifted / shifted.sum(axis=axis, keepdims=True)]


class Binary(Op):
    """Two inputs broadcast against each other, as numpy does."""

    arity = (2, 2)

    def infer(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        return [(broadcast_shapes(inputs[0].shape, inputs[1].shape), inputs[0].dtype)]


@register
class Add(Binary):
    name = "add"

    def run(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        return [arrays[0] + arrays[1]]


@register
class Sub(Binary):
    name = "sub"

    def run(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        return [arrays[0] - arrays[1]]


@register
class Mul(Binary):
    name = "mul"

    def run(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        return [arrays[0] * arrays[1]]


# ---------------------------------------------------------------- linear algebra


@register
class MatMul(Op):
    """numpy.matmul: 1-D operands are promoted and the promoted axis dropped again."""

    name = "matmul"
    arity = (2, 2)

    def infer(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        a, b = tuple(inputs[0].shape), tuple(inputs[1].shape)
        if not a or not b:
            raise ShapeError("matmul does not take scalars")
        a2 = (1, *a) if len(a) == 1 else a
        b2 = (*b, 1) if len(b) == 1 else b
        if not _dims_agree(a2[-1], b2[-2]):
            raise ShapeError(f"matmul inner dimensions differ: {a} @ {b}")
        batch = broadcast_shapes(a2[:-2], b2[:-2])
        out = (*batch, *(a2[-2:-1] if len(a) > 1 else ()), *(b2[-1:] if len(b) > 1 else ()))
        return [(out, inputs[0].dtype)]

    def run(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        return [np.matmul(arrays[0], arrays[1])]


@register
class Dense(Op):
    """y = activation(x @ weight + bias); weight (in, out), bias (out,) optional.

    The canonical form of a fully connected layer: quantizers and targets
    handle this one op instead of every matmul/add spelling a frontend emits.
    """

    name = "dense"
    arity = (2, 3)
    activations: ClassVar[tuple[str, ...]] = ("none", "relu")

    def infer(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        x, weight = inputs[0].shape, inputs[1].shape
        if attrs.get("activation", "none") not in self.activations:
            raise ShapeError(
                f"dense activation {attrs['activation']!r} is not one of {', '.join(self.activations)}"
            )
        if len(weight) != 2:
            raise ShapeError(f"dense weight must be 2-D (in, out), got {weight}")
        if not x or not _dims_agree(x[-1], weight[0]):
            raise ShapeError(f"dense input {x} does not end in the weight's in_features {weight[0]}")
        if len(inputs) == 3 and tuple(inputs[2].shape) != (weight[1],):
            raise ShapeError(f"dense bias must have shape ({weight[1]},), got {inputs[2].shape}")
        return [((*x[:-1], weight[1]), inputs[0].dtype)]

    def run(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        y = np.matmul(arrays[0], arrays[1])
        if len(arrays) == 3:
            y = y + arrays[2]
        if attrs.get("activation", "none") == "relu":
            y = np.maximum(y, np.zeros((), y.dtype))
        return [y]


# ---------------------------------------------------------------- shape ops


def _product(dims: tuple[int | None, ...] | list[int | None]) -> int | None:
    return None if None in dims else math.prod(dims)  # type: ignore[arg-type]


@register
class Reshape(Op):
    """Reshape to `attrs["shape"]`: -1 is inferred, 0 copies the input's size at that axis.

    0 lets a traced reshape keep the dynamic batch axis instead of baking in the
    batch size seen while tracing.
    """

    name = "reshape"

    def infer(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        source = tuple(inputs[0].shape)
        target = list(attrs["shape"])
        if target.count(-1) > 1:
            raise ShapeError(f"reshape target {target} has more than one -1")
        for axis, size in enumerate(target):
            if size == 0:
                if axis >= len(source):
                    raise ShapeError(f"reshape copies axis {axis} that input {source} lacks")
                target[axis] = source[axis]
            elif size < -1:
                raise ShapeError(f"reshape target {attrs['shape']} has a negative size")
        copied = [source[a] for a, s in enumerate(attrs["shape"]) if s == 0]
        # Dynamic axes copied through cancel out; any other dynamic axis makes the total unknown.
        remaining = [d for d in source if d is not None]
        if source.count(None) != copied.count(None):
            remaining = [None]
        total = _product(remaining)
        known = _product([d for d, s in zip(target, attrs["shape"]) if s != -1 and d is not None])
        if total is not None and (
            (-1 in attrs["shape"] and (not known or total % known))
            or (-1 not in attrs["shape"] and known != total)
        ):
            raise ShapeError(f"cannot reshape {source} into {attrs['shape']}")
        if -1 in attrs["shape"]:
            target[attrs["shape"].index(-1)] = None if total is None else total // known
        return [(tuple(target), inputs[0].dtype)]

    def run(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        shape = [arrays[0].shape[a] if s == 0 else s for a, s in enumerate(attrs["shape"])]
        return [arrays[0].reshape(shape)]


@register
class Flatten(Op):
    """Collapse to 2-D around `attrs["axis"]` (default 1): (prod(shape[:axis]), prod(shape[axis:]))."""

    name = "flatten"

    def infer(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        shape = tuple(inputs[0].shape)
        axis = attrs.get("axis", 1)
        if not 0 <= axis <= len(shape):
            raise ShapeError(f"flatten axis {axis} is out of range for shape {shape}")
        return [((_product(shape[:axis]), _product(shape[axis:])), inputs[0].dtype)]

    def run(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        axis = attrs.get("axis", 1)
        shape = arrays[0].shape
        return [arrays[0].reshape(math.prod(shape[:axis]), math.prod(shape[axis:]))]
