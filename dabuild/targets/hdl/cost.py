"""da4ml's cost estimate of a QGraph, layer by layer: cheap enough to price the many configs a search compares.

Tracing a whole graph through da4ml (what the hdl target exports) solves one
constant-matrix problem per dense layer; on jet-mlp that takes seconds, and a
tuning search asks the cost of dozens of configs that differ in one or two
layers. So this model traces each layer alone, from a symbolic input whose
range is the input tensor's fixed-point type (narrowed by the producing
layer's clamp, e.g. [0, 127] after a fused relu), and keeps the layer's
cost under a key of everything the trace reads: the layer's fields and
arrays, its input and output quantization and that input range. A config
that changes one layer's weights reprices that layer only.

The sum is an estimate of the whole-graph trace, not equal to it: in the
whole graph da4ml knows each input's arrival time and the value range the
previous layer really produces, and balances its adder trees with them; and
the solver runs at one decomposition depth (`FAST`) instead of trying all.
bench/hdl.py prints both; on jet-mlp the sum is a few percent below the full
trace (it ranks configs, it does not replace the exported figure).
"""

from __future__ import annotations

import hashlib
import json
from typing import ClassVar

import numpy as np

from dabuild.errors import BuildError
from dabuild.quant.layers.elementwise import QClamp
from dabuild.quant.layers.linear import QWeighted
from dabuild.quant.qgraph import QGraph, QLayer
from dabuild.targets.hdl.symbolic import CONVERTERS

try:
    from da4ml.trace import FixedVariableArray, HWConfig, comb_trace
except ImportError as error:  # the tuner turns this into a BuildError naming the package
    raise ImportError("da4ml is not installed", name="da4ml") from error


# da4ml's solver tries every decomposition depth by default; one (its default depth) is ~4x faster and costs within
# about a percent more or less per layer, which is what a search comparing dozens of configs needs.
FAST = {"search_all_decompose_dc": False}


class Da4mlCost:
    """Prices a QGraph in da4ml's LUT estimate: the sum over its layers, each traced alone and cached.

    Registered as cost model `da4ml` (entry-point group `dabuild.cost_models`),
    which capability `da4ml` names. `traced` counts the layers actually traced,
    so a caller can see what the cache saved.
    """

    unit: ClassVar[str] = "LUTs"
    packages: ClassVar[tuple[str, ...]] = ("da4ml",)

    def __init__(self, hwconf: HWConfig = HWConfig(1, -1, -1), solver_options: dict | None = None) -> None:
        self.hwconf = hwconf
        self.solver_options = dict(FAST if solver_options is None else solver_options)
        self.traced = 0
        self._layers: dict[str, float] = {}

    def __call__(self, qgraph: QGraph) -> float:
        ranges = output_ranges(qgraph)
        return sum(self.layer_cost(qgraph, layer, ranges[layer.inputs[0]]) for layer in qgraph.layers)

    def layer_cost(self, qgraph: QGraph, layer: QLayer, input_range: tuple[int, int]) -> float:
        """da4ml's cost of `layer` alone, its input spanning the integers `input_range` (cached)."""
        key = layer_key(qgraph, layer, input_range)
        if key not in self._layers:
            self._layers[key] = self._trace(qgraph, layer, input_range)
            self.traced += 1
        return self._layers[key]

    def _trace(self, qgraph: QGraph, layer: QLayer, input_range: tuple[int, int]) -> float:
        tensor = qgraph.tensors[layer.inputs[0]]
        step = tensor.params.scale
        low, high = (np.full(tensor.shape, bound * step) for bound in input_range)
        symbols = FixedVariableArray.from_lhs(low, high, np.full(tensor.shape, step), self.hwconf,
                                              solver_options=self.solver_options)
        converter = CONVERTERS.get(layer.op)
        if converter is None:
            raise BuildError(f"layer {layer.name!r}: op {layer.op!r} has no da4ml mapping, so da4ml cannot price it")
        [output] = converter(layer, qgraph, [symbols])
        return float(comb_trace(symbols, output).cost)


def output_ranges(qgraph: QGraph) -> dict[str, tuple[int, int]]:
    """The integers each tensor can hold: its dtype's range, narrowed by the clamp of the layer that writes it."""
    ranges = {name: (tensor.params.qmin, tensor.params.qmax) for name, tensor in qgraph.tensors.items()}
    for layer in qgraph.layers:
        bounds = _clamp_of(layer)
        if bounds is not None:
            qmin, qmax = ranges[layer.outputs[0]]
            ranges[layer.outputs[0]] = (max(qmin, bounds[0]), min(qmax, bounds[1]))
    return ranges


def _clamp_of(layer: QLayer) -> tuple[int, int] | None:
    if isinstance(layer, QWeighted):
        return layer.output_min, layer.output_max
    if isinstance(layer, QClamp):
        return layer.low, layer.high
    return None


def layer_key(qgraph: QGraph, layer: QLayer, input_range: tuple[int, int]) -> str:
    """A digest of everything tracing `layer` alone reads (not its name nor its tensors' names)."""
    digest = hashlib.sha256()
    quantization = [qgraph.tensors[name].params for name in (*layer.inputs, *layer.outputs)]
    description = {
        "op": layer.op,
        "attrs": layer.attrs(),
        "shape": qgraph.tensors[layer.inputs[0]].shape,
        "quantization": [[p.scale, p.zero_point, p.dtype] for p in quantization],
        "input_range": input_range,
    }
    digest.update(json.dumps(description, sort_keys=True, default=str).encode())
    for name, array in sorted(layer.arrays().items()):
        array = np.ascontiguousarray(array)
        digest.update(f"{name}{array.dtype}{array.shape}".encode() + array.tobytes())
    return digest.hexdigest()
