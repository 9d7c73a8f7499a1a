"""Layers that only move, copy or select integer values, and concat.

Layout ops (identity, reshape, flatten, transpose, squeeze, unsqueeze, slice,
split, pad, gather with constant indices, tile, expand, nearest resize) and the max ops (max_pool, reduce_max) output values of their
input (pad: or its quantized pad value), so they run on integers without any
requantization and their outputs keep the input's params. The reference runs
the IR op's own float kernel on the integer values held in float32, which
is exact: float32 holds every value of a type up to 16 bits, and moving or comparing values never
rounds. max_pool takes the max of its windows in the integer type itself (the same values, without two
conversions of the whole tensor: they were 6 % of a ResNet-50 trial). Constant padding pads with the quantized pad value (the zero point
for the usual 0).

concat requantizes each input to the output's params (an input whose params
already equal the output's gets the multiplier 2**30 >> 30, an exact copy).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from dabuild.ir.ops import OPS
from dabuild.ir.ops.pool import MaxPool
from dabuild.qir.fixed_point import requantize
from dabuild.qir.qgraph import QGraph, QLayer, Trace, layer_type

SELECTION_OPS = ("identity", "reshape", "flatten", "transpose", "squeeze", "unsqueeze", "slice", "split", "pad",
                 "max_pool", "reduce_max", "gather", "tile", "expand", "resize")


@dataclass
class QSelection(QLayer):
    """The IR op `op` applied to integer values; `op_attrs` are its resolved attributes."""

    op_attrs: dict[str, Any]

    def run(self, inputs: list[np.ndarray], graph: QGraph, trace: Trace | None) -> list[np.ndarray]:
        dtype = inputs[0].dtype
        return [np.asarray(y).astype(dtype) for y in OPS[self.op].run([inputs[0].astype(np.float32)], self.op_attrs)]


@layer_type
@dataclass
class QMaxPool(QSelection):
    """int8 max_pool: each window's greatest tap, in the integer type; the padding holds the type's least
    value, which any input tap of the window ties or beats (every window of a pool holds one: the float
    path's -inf, cast back to integers, would not be a value either)."""

    op: ClassVar[str] = "max_pool"

    def run(self, inputs: list[np.ndarray], graph: QGraph, trace: Trace | None) -> list[np.ndarray]:
        x = inputs[0]
        taps, _ = OPS.typed("max_pool", MaxPool).tap_views(x, self.op_attrs, np.iinfo(x.dtype).min)
        y = taps[0].copy(order="K")  # the taps' memory order: channels last after a conv
        for tap in taps[1:]:
            np.maximum(y, tap, out=y)
        return [y]


for _op in SELECTION_OPS:  # one registered layer class per op, so targets key their kernels by op
    if _op == "max_pool":
        continue
    layer_type(type(f"Q{_op.title().replace('_', '')}", (QSelection,), {"op": _op, "__doc__": f"int8 {_op}."}))


@layer_type
@dataclass
class QConcat(QLayer):
    """Each input requantized to the output's params, then joined along `axis` (batch axis 0 included)."""

    op: ClassVar[str] = "concat"
    axis: int
    multiplier: np.ndarray  # int32 (inputs,): s_i / s_y
    shift: np.ndarray       # int32 (inputs,)

    def run(self, inputs: list[np.ndarray], graph: QGraph, trace: Trace | None) -> list[np.ndarray]:
        target = self.output_params(graph)
        parts = [target.saturate(requantize(self.params(graph, i).centred(x), self.multiplier[i], self.shift[i], graph.rounding)
                                 + target.zero_point) for i, x in enumerate(inputs)]
        return [np.concatenate(parts, axis=self.axis)]
