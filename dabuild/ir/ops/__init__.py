"""The op set: one small class per op, holding its shape rule and its numpy kernel.

Adding an op means writing one class in the module of its kind (a module `OPS`
names, in ir/ops/base.py, which it imports on its first lookup) and decorating it
with `@register`; shape inference, the interpreter, the docs (docs/ops.md) and
serialisation pick it up from `OPS`. Shapes may contain `None` for a dynamic
dimension (the batch); kernels follow numpy's broadcasting semantics and
compute in float32.
"""

from dabuild.ir.ops.activation import Activation, activation_names
from dabuild.ir.ops.base import OPS, REQUIRED, Op, ShapeError, broadcast_shapes, register

__all__ = ["OPS", "REQUIRED", "Activation", "Op", "ShapeError", "activation_names", "broadcast_shapes", "register"]
