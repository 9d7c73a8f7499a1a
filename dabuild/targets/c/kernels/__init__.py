"""The C kernels, one module per kind; KERNELS imports them on its first lookup (see `registry`)."""

from dabuild.targets.c.kernels.registry import KERNELS, Kernel, Operand, Step, select

__all__ = ["KERNELS", "Kernel", "Operand", "Step", "select"]
