"""The C kernels, one module per kind; importing this package registers them all (see `registry`)."""

from dabuild.targets.c.kernels import (  # noqa: F401  (they register)
    blocked,
    elementwise,
    embedding,
    island,
    linear,
    matmul,
    movement,
    pool,
    resize,
)
from dabuild.targets.c.kernels import select as select_kernels  # noqa: F401  (registers; `select` is the function)
from dabuild.targets.c.kernels.registry import KERNELS, Kernel, Operand, Step, select

__all__ = ["KERNELS", "Kernel", "Operand", "Step", "select"]
