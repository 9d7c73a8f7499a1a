"""The C kernels, one module per kind; importing this package registers them all (see `registry`)."""

from dabuild.targets.c.kernels import elementwise, linear, matmul, movement, pool, select  # noqa: F401  (they register)
from dabuild.targets.c.kernels.registry import KERNELS, Kernel, Operand, Step, select

__all__ = ["KERNELS", "Kernel", "Operand", "Step", "select"]
