"""matmul of two int8 activations: one (M, K) @ (K, N) product per pair of matrices the batch axes broadcast.

The operands are read canonically (row-major), so the offsets of each pair's
matrices are computed here once and the C code runs a plain triple loop over
centred values, requantized as the reference does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dabuild.qir.layers.matmul import QMatMul
from dabuild.targets.c.kernels.registry import CANONICAL, Step, kernel


def _matrix_offsets(shape: tuple[int, ...], batch: tuple[int, ...]) -> np.ndarray:
    """The offset of each matrix of a canonical (..., rows, columns) array, broadcast to `batch`."""
    count = int(np.prod(shape[:-2], dtype=np.int64))
    starts = (np.arange(count) * shape[-2] * shape[-1]).reshape(shape[:-2])
    return np.broadcast_to(starts, batch).ravel()


@kernel("matmul", "matmul", inputs=CANONICAL, outputs=CANONICAL)
def matmul(step: Step) -> dict[str, Any]:
    layer: QMatMul = step.layer  # type: ignore[assignment]
    a, b = step.inputs
    out = step.outputs[0]
    batch = out.shape[:-2]
    return {"rows": a.shape[-2], "depth": a.shape[-1], "columns": b.shape[-1],
            "a_offsets": _matrix_offsets(a.shape, batch), "b_offsets": _matrix_offsets(b.shape, batch),
            "count": int(np.prod(batch, dtype=np.int64)), "zero_points": [a.quant.zero_point, b.quant.zero_point],
            "multiplier": int(layer.multiplier[0]), "shift": int(layer.shift[0]),
            "output_zero_point": out.quant.zero_point}
