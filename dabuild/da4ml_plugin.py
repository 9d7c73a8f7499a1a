"""dabuild as a da4ml frontend: `da4ml.converter.trace_model(qgraph)` for any quantized dabuild graph.

Registered in da4ml's entry-point group `dais_tracer.plugins` under the name
`dabuild`, which is what da4ml derives from a QGraph's module, so no
`framework=` argument is needed. Whatever framework the model came from
(numpy, ONNX, torch), dabuild has lowered it to integer layers; the mapping
of those onto da4ml's symbolic fixed-point arithmetic is in
`dabuild.targets.hdl.symbolic`.
"""

from __future__ import annotations

from collections.abc import Sequence

from da4ml.converter.plugin import DAISTracerPluginBase
from da4ml.trace import FixedVariableArray

from dabuild.errors import BuildError
from dabuild.qir.qgraph import QGraph
from dabuild.targets.hdl.symbolic import apply_qgraph


class DabuildDAISTracer(DAISTracerPluginBase):
    """Traces a QGraph (one input, one output) into da4ml symbols, keeping every tensor for `dump=True`."""

    model: QGraph

    def get_input_shapes(self) -> Sequence[tuple[int, ...]]:
        if not isinstance(self.model, QGraph):
            raise BuildError(f"da4ml's dabuild plugin traces a dabuild QGraph (dabuild.quant.quantize), "
                             f"not {type(self.model).__name__}")
        return [self.model.tensors[self.model.input].shape]

    def apply_model(self, verbose: bool, inputs: tuple[FixedVariableArray, ...]
                    ) -> tuple[dict[str, FixedVariableArray], list[str]]:
        if len(inputs) != 1:
            raise BuildError(f"a dabuild QGraph takes one input; da4ml passed {len(inputs)}")
        return apply_qgraph(self.model, inputs[0]), [self.model.output]
