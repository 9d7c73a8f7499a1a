"""Kernels that pick one of their inputs' values: max, min, and where with a constant condition.

One walk over the output's storage with one stride per operand (0 where it
broadcasts), as the binary kernels; each input requantized to the output's
params as the reference does (a plain read where its params already are the
output's), then compared or selected.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dabuild.qir.layers.select import QPick, QWhere
from dabuild.targets.c.kernels.registry import Step, kernel
from dabuild.targets.c.layout import Walk, broadcast_strides


def _operands(step: Step) -> list[dict[str, Any]]:
    layer: QPick = step.layer  # type: ignore[assignment]
    out = step.outputs[0]
    return [{"exact": operand.params == out.params, "zero_point": operand.quant.zero_point,
             "multiplier": int(layer.multiplier[k]), "shift": int(layer.shift[k])}
            for k, operand in enumerate(step.inputs)]


@kernel("max", "pick")
@kernel("min", "pick")
@kernel("where", "pick")
def pick(step: Step) -> dict[str, Any]:
    out = step.outputs[0]
    strides = {"o": out.strides, **{f"i{k}": broadcast_strides(operand.storage, out.shape)
                                    for k, operand in enumerate(step.inputs)}}
    context: dict[str, Any] = {"operands": _operands(step), "output_zero_point": out.quant.zero_point,
                               "op": step.kernel.op}
    if isinstance(step.layer, QWhere):  # the condition at the output's own offsets, so it walks with it
        condition = np.broadcast_to(step.layer.condition, out.shape)
        offsets = sum(index * stride for index, stride in zip(np.indices(out.shape), out.strides))
        laid_out = np.zeros(out.size, np.int8)
        laid_out[np.asarray(offsets).ravel()] = condition.ravel()
        strides["c"] = out.strides
        context["condition"] = laid_out
    context["walk"] = Walk.over(out.shape, out.storage.order, strides)
    return context
