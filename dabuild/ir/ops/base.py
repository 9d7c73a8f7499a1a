"""The op registry and the base class every op derives from.

An op is one small class: its attribute defaults, its shape rule (`shape_rule`)
and its numpy kernel (`kernel`), plus two one-line strings that docs/ops.md is
generated from. `infer` and `run` fill in default attributes and reject unknown
ones before calling them, so a frontend's typo in an attribute name fails at
trace time instead of being silently ignored. `prepare` does that once for an
interpreter plan that runs the same node batch after batch.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from dabuild.registry import Registry

if TYPE_CHECKING:
    from dabuild.ir.graph import TensorSpec

Shape = tuple["int | None", ...]
OutputSpec = tuple[Shape, str]  # (shape, dtype) of one output
Kernel = Callable[[list[np.ndarray], "np.ndarray | None"], list[np.ndarray]]  # (arrays, out) -> outputs


class ShapeError(ValueError):
    """An op's inputs or attributes do not fit its rules; the graph adds which node it was."""


class _Required:
    """Marks an attribute that has no default."""

    def __repr__(self) -> str:
        return "required"


REQUIRED: Any = _Required()


class Op(ABC):
    """Base of every op: `infer` maps input specs to output specs, `run` maps arrays to arrays."""

    name: ClassVar[str]
    arity: ClassVar[tuple[int, int]] = (1, 1)  # fewest and most inputs accepted
    defaults: ClassVar[dict[str, Any]] = {}  # every attribute the op reads, with its default (or REQUIRED)
    signature: ClassVar[str] = "x"  # the inputs, for docs/ops.md; `?` marks an optional one
    rule: ClassVar[str] = "same shape as x"  # the shape rule in one line, for docs/ops.md
    required: ClassVar[frozenset[str]] = frozenset()  # the attributes without default, derived from `defaults`
    in_place: ClassVar[tuple[int, ...]] = ()  # inputs the prepared kernel may write its output into (see `prepare`)
    per_sample: ClassVar[bool] = False  # output sample i depends on input sample i alone (batch axis 0)
    reads_indices: ClassVar[bool] = False  # input 0 is integer indices (token ids): never a float island's op

    def infer(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        """(shape, dtype) of each output; ShapeError if the inputs or attributes do not fit."""
        return self.shape_rule(inputs, self.resolve(attrs))

    def run(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        """The outputs computed from the input arrays."""
        return self.kernel(arrays, self.resolve(attrs))

    def prepare(self, attrs: dict[str, Any]) -> Kernel:
        """The kernel with its attributes resolved (and checked) once, for a plan that runs the node many times.

        The returned function takes the input arrays and `out`: None, or the
        input at one of the `in_place` positions when the caller no longer
        needs it; the kernel may then write its output into that array's
        memory if the output fits it.
        """
        resolved = self.resolve(attrs)
        kernel = self.kernel
        return lambda arrays, out: kernel(arrays, resolved)

    @abstractmethod
    def shape_rule(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        """`infer` with every attribute present."""

    @abstractmethod
    def kernel(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        """`run` with every attribute present."""

    def samplewise(self, attrs: dict[str, Any]) -> bool:
        """Whether slices of the batch give the slices of the outputs, so a batch may be split across threads."""
        return self.per_sample

    def resolve(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """`attrs` over the defaults; ShapeError naming unknown or missing attributes.

        The interpreter calls this for every node of every batch, so the common
        case is two set comparisons and one dict merge.
        """
        if not attrs.keys() <= self.defaults.keys():
            unknown = sorted(set(attrs) - set(self.defaults))
            known = ", ".join(sorted(self.defaults)) or "none"
            raise ShapeError(f"{self.name} has no attribute {', '.join(map(repr, unknown))} (attributes: {known})")
        if not self.required <= attrs.keys():
            missing = ", ".join(map(repr, sorted(self.required - attrs.keys())))
            raise ShapeError(f"{self.name} needs attribute {missing}")
        return {**self.defaults, **attrs}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.required = frozenset(key for key, value in cls.defaults.items() if value is REQUIRED)

    def check_arity(self, count: int) -> None:
        low, high = self.arity
        if not low <= count <= high:
            expected = str(low) if low == high else f"{low} to {high}"
            raise ShapeError(f"{self.name} takes {expected} inputs, got {count}")


# Full names, not built ones: the stages' code digests (pipeline/code_digest.py) follow these strings.
OPS: Registry[Op] = Registry("IR op", "dabuild's op set", (
    "dabuild.ir.ops.activation", "dabuild.ir.ops.elementwise", "dabuild.ir.ops.linear",
    "dabuild.ir.ops.normalization", "dabuild.ir.ops.pool", "dabuild.ir.ops.quant", "dabuild.ir.ops.reduce",
    "dabuild.ir.ops.resize", "dabuild.ir.ops.shape", "dabuild.ir.ops.transposed",
))


def register(cls: type[Op]) -> type[Op]:
    """Class decorator adding one instance of the op to `OPS` under `cls.name`."""
    OPS.add(cls.name, cls())
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


def dims_agree(a: int | None, b: int | None) -> bool:
    return a is None or b is None or a == b


def check_vector(op: str, role: str, spec: TensorSpec, size: int | None) -> None:
    """ShapeError unless `spec` is a vector of `size` entries (a per-channel scale, bias, mean, variance)."""
    if len(spec.shape) != 1 or not dims_agree(spec.shape[0], size):
        raise ShapeError(f"{op} {role} must have shape ({size},), got {tuple(spec.shape)}")


def product(dims: Sequence[int | None]) -> int | None:
    """Product of the sizes, or None when any is dynamic."""
    return None if None in dims else math.prod(dims)  # type: ignore[arg-type]


def normalize_axis(axis: int, rank: int, what: str) -> int:
    """`axis` counted from the front; ShapeError if it is outside a tensor of `rank` axes."""
    if not -rank <= axis < rank:
        raise ShapeError(f"{what} axis {axis} is out of range for a rank-{rank} tensor")
    return axis % rank


def normalize_axes(axes: list[int], rank: int, what: str) -> list[int]:
    """Each axis counted from the front; ShapeError on repeats or out-of-range axes."""
    result = [normalize_axis(axis, rank, what) for axis in axes]
    if len(set(result)) != len(result):
        raise ShapeError(f"{what} axes {axes} repeat an axis")
    return result


def fits(out: np.ndarray | None, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray | None:
    """`out` if an output of `shape` and `dtype` can be written into it, else None."""
    return out if out is not None and out.shape == shape and out.dtype == dtype else None
