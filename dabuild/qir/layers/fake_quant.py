"""fake_quant: the model's own quantization of a tensor (dabuild/ir/given_quant.py), lowered to nothing or a requantization.

`quantize` gives the fake_quant's input tensor the node's parameters (so the
layer writing it requantizes straight to them); the fake_quant itself then
moves no value: its output is the same integer tensor, and the lowered graph
calls it by the output's name. Only where the input kept other parameters (a
max pool or reshape passes its input's on; a tensor two fake_quants read) is
it a requantization: a one-input concat along the last axis, which every
integer target runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from dabuild.errors import BuildError
from dabuild.ir.given_quant import FixedQuant
from dabuild.qir.qgraph import QGraph, QLayer, Trace, layer_type


@layer_type
@dataclass
class QFixedQuant(QLayer):
    """A fixed-point quantizer with a type per element (`dabuild.ir.given_quant.FixedQuant`), integers to integers:
    the input's integers (units of its scale 2**-F_in) rounded and wrapped or saturated per element, written in
    units of the output's scale 2**-F."""

    op: ClassVar[str] = "fixed_quant"
    k: np.ndarray         # int8, the per-sample shape or broadcast to it (IR layout)
    i: np.ndarray         # int8
    f: np.ndarray         # int8
    rounding: str
    overflow: str

    @property
    def quantizer(self) -> FixedQuant:
        return FixedQuant.of(self.k, self.i, self.f, self.rounding, self.overflow)

    def run(self, inputs: list[np.ndarray], graph: QGraph, trace: Trace | None) -> list[np.ndarray]:
        source, target = self.params(graph), self.output_params(graph)
        quant = self.quantizer
        if -math.log2(target.scale) != quant.fractional_bits:
            raise BuildError(f"layer {self.name!r} (fixed_quant): output scale {target.scale:g} is not 2**-"
                             f"{quant.fractional_bits}")
        centred = source.centred(inputs[0])
        return [quant.integers(centred, -int(math.log2(source.scale))).astype(target.storage)]
