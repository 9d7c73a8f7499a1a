"""Lowering of max, min and where into pick layers.

The layers it makes, and the arithmetic they run, are dabuild.qir.layers.select's."""

from __future__ import annotations

from typing import Any

import numpy as np

from dabuild.errors import BuildError
from dabuild.qir.fixed_point import quantize_multiplier
from dabuild.qir.layers.select import QMax, QMin, QWhere
from dabuild.qir.qgraph import QLayer
from dabuild.quant.lowering import Lowering, lowers


@lowers("max", "min", "where", layers={"max": ("max",), "min": ("min",), "where": ("where",)})
def lower_pick(ctx: Lowering) -> list[QLayer]:
    node = ctx.node
    values = node.inputs[1:] if node.op == "where" else node.inputs
    inputs = [ctx.int8_input(name) for name in values]
    target = ctx.calibrated(node.outputs[0])
    ctx.output(node.outputs[0], target)
    scales = np.array([ctx.params(name).scale for name in inputs])
    multiplier, shift = quantize_multiplier(scales / target.scale, ctx.where)
    fields: dict[str, Any] = {"name": node.name, "inputs": inputs, "outputs": list(node.outputs), "multiplier": multiplier,
              "shift": shift}
    if node.op == "where":
        condition = ctx.constant(node.inputs[0]).astype(bool)
        if condition.ndim == ctx.rank(node.outputs[0]):  # a leading batch axis of the constant: it must be 1
            if condition.shape[0] != 1:
                raise BuildError(f"{ctx.where}: its condition differs from sample to sample of the batch")
            condition = condition[0]
        return [QWhere(**fields, condition=condition)]
    return [QMax(**fields) if node.op == "max" else QMin(**fields)]
