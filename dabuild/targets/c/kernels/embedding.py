"""The embedding kernel: rows of an int8 table at the int32 indices of the graph input (token ids).

The model's `in` is then int32 (`model_input_t`). An index outside the table
gives a row of the output's zero point (real 0) and makes `model_forward`
return -2: a caller learns of it, and no memory outside the table is read.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dabuild.qir.layers.embedding import QEmbedding
from dabuild.targets.c.kernels.registry import CANONICAL, Step, kernel


@kernel("embedding", "embedding", inputs=CANONICAL, outputs=CANONICAL, dtypes=("int32/int8",),
        granularities=("per_tensor", "per_channel"))
def embedding(step: Step) -> dict[str, Any]:
    """The table as one flat array (rows of `width`), and per row its multiplier and shift when rows have scales
    of their own (per_channel)."""
    layer: QEmbedding = step.layer  # type: ignore[assignment]
    rows = len(layer.weight)
    width = int(np.prod(layer.weight.shape[1:], dtype=np.int64))
    return {"table": layer.weight.reshape(rows, width), "rows": rows, "width": width, "count": step.inputs[0].size,
            "multiplier": layer.multiplier, "shift": layer.shift, "per_row": layer.per_row,
            "zero_point": step.outputs[0].quant.zero_point}
