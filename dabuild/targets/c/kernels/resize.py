"""Linear resize over the last one or two axes: per output row and column, its two neighbours and the upper
one's fixed-point weight (tables made from the layer), one exact int64 sum, one requantization."""

from __future__ import annotations

from typing import Any

import numpy as np

from dabuild.qir.layers.resize import FRACTION_BITS, QResizeLinear
from dabuild.qir.qgraph import QGraph
from dabuild.targets.c.kernels.registry import CANONICAL, Step, kernel
from dabuild.targets.c.profiles import Profile


def _last_axes(layer: QResizeLinear, qgraph: QGraph, profile: Profile) -> str | None:
    rank = len(qgraph.tensors[layer.inputs[0]].shape)  # per sample
    if any(axis < rank - 1 for axis in layer.axes):  # batch-first numbering: the last two are rank - 1, rank
        return "it resizes axes other than the last two"
    return None


@kernel("resize_linear", "resize_linear", inputs=CANONICAL, outputs=CANONICAL, when=_last_axes)
def resize_linear(step: Step) -> dict[str, Any]:
    layer: QResizeLinear = step.layer  # type: ignore[assignment]
    x, y = step.inputs[0].shape, step.outputs[0].shape
    rank = len(x)
    height, width = (x[-2], x[-1]) if rank >= 2 else (1, x[-1])
    out_height, out_width = (y[-2], y[-1]) if rank >= 2 else (1, y[-1])
    tables = {}
    for name, axis in (("rows", rank - 1), ("columns", rank)):
        if axis in layer.axes:
            k = layer.axes.index(axis)
            tables[name] = {"lower": np.array(layer.lower[k], np.int32), "upper": np.array(layer.upper[k], np.int32),
                            "weight": np.array(layer.weight[k], np.int32)}
    return {"planes": int(np.prod(x[:-2], dtype=np.int64)) if rank >= 2 else 1, "height": height, "width": width,
            "out_height": out_height, "out_width": out_width, "tables": tables, "one": 1 << FRACTION_BITS,
            "zero_point": step.inputs[0].quant.zero_point, "output_zero_point": step.outputs[0].quant.zero_point,
            "multiplier": int(layer.multiplier[0]), "shift": int(layer.shift[0])}
