"""C99 literals of float32 values, exact: what the generated code's float constants are written as."""

from __future__ import annotations

import numpy as np


def c_float(value: float) -> str:
    """An exact float32 literal (hex float, C99) of `value` rounded to float32, as numpy rounds it."""
    return float(np.float32(value)).hex() + "f"


def c_floats(values: np.ndarray, per_line: int = 8) -> str:
    """Array initialiser body of exact float32 literals, `per_line` to a line."""
    flat = [c_float(float(v)) for v in np.asarray(values, np.float32).ravel()]
    lines = [", ".join(flat[i:i + per_line]) for i in range(0, len(flat), per_line)]
    return ",\n".join("    " + line for line in lines)
