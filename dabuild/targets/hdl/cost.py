"""da4ml's cost estimate of a QGraph, layer by layer: cheap enough to price the many configs a search compares.

Tracing a whole graph through da4ml (what the hdl target exports) solves one
constant-matrix problem per dense layer; on jet-mlp that takes seconds, and a
tuning search asks the cost of dozens of configs that differ in one or two
layers. So this model traces each layer alone, from one symbolic input per
layer input whose range is that tensor's fixed-point type (narrowed by the
producing layer's clamp, e.g. [0, 127] after a fused relu, and carried through
layers that only move or select values), or the constant itself for a graph
constant, and keeps the layer's cost under a key of everything the trace
reads: the layer's fields and arrays, its inputs' shapes, quantization and
ranges, its constants and its output quantization. A config that changes one
layer's weights reprices that layer only.

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

from dabuild.qir.layers.elementwise import QClamp, QLookup
from dabuild.qir.layers.linear import QWeighted
from dabuild.qir.layers.shape import QSelection
from dabuild.qir.qgraph import QGraph, QLayer
from dabuild.targets.hdl.symbolic import constant_symbols, converter_of

try:
    from da4ml.trace import FixedVariableArray, HWConfig, comb_trace
except ImportError as error:  # the tuner turns this into a BuildError naming the package
    raise ImportError("da4ml is not installed", name="da4ml") from error


# da4ml's solver tries every decomposition depth by default; one (its default depth) is ~4x faster and costs within
# about a percent more or less per layer, which is what a search comparing dozens of configs needs.
FAST = {"search_all_decompose_dc": False}
DEFAULT_HWCONF = HWConfig(1, -1, -1)  # adder size 1; carry size and latency cutoff -1: none


class Da4mlCost:
    """Prices a QGraph in da4ml's LUT estimate: the sum over its layers, each traced alone and cached.

    Registered as cost model `da4ml` (entry-point group `dabuild.cost_models`),
    which capability `da4ml` names. `traced` counts the layers actually traced,
    so a caller can see what the cache saved.
    """

    unit: ClassVar[str] = "LUTs"
    packages: ClassVar[tuple[str, ...]] = ("da4ml",)

    def __init__(self, hwconf: HWConfig = DEFAULT_HWCONF, solver_options: dict | None = None) -> None:
        self.hwconf = hwconf
        self.solver_options = dict(FAST if solver_options is None else solver_options)
        self.traced = 0
        self._layers: dict[str, float] = {}

    def __call__(self, qgraph: QGraph) -> float:
        ranges = output_ranges(qgraph)
        return sum(self.layer_cost(qgraph, layer, [ranges[name] for name in layer.inputs]) for layer in qgraph.layers)

    def layer_cost(self, qgraph: QGraph, layer: QLayer, input_ranges: list[tuple[int, int]]) -> float:
        """da4ml's cost of `layer` alone, input i spanning the integers `input_ranges[i]` (cached)."""
        key = layer_key(qgraph, layer, input_ranges)
        if key not in self._layers:
            self._layers[key] = self._trace(qgraph, layer, input_ranges)
            self.traced += 1
        return self._layers[key]

    def _trace(self, qgraph: QGraph, layer: QLayer, input_ranges: list[tuple[int, int]]) -> float:
        symbols = {}
        for name, (low, high) in zip(layer.inputs, input_ranges):
            if name not in qgraph.constants:
                tensor = qgraph.tensors[name]
                step = tensor.params.scale
                symbols[name] = FixedVariableArray.from_lhs(
                    np.full(tensor.shape, low * step), np.full(tensor.shape, high * step),
                    np.full(tensor.shape, step), self.hwconf, solver_options=self.solver_options)
        like = next(iter(symbols.values()))
        outputs = converter_of(layer)(layer, qgraph, [symbols[name] if name in symbols else constant_symbols(qgraph, name, like)
                                            for name in layer.inputs])
        inputs = np.concatenate([np.ravel(array._vars) for array in symbols.values()])
        return float(comb_trace(inputs, np.concatenate([np.ravel(array._vars) for array in outputs])).cost)


def output_ranges(qgraph: QGraph) -> dict[str, tuple[int, int]]:
    """The integers each tensor can hold: its dtype's range, narrowed by the clamp of the layer that writes it
    (or its table's values), and carried through layers that only move or select values."""
    ranges = {name: (tensor.params.qmin, tensor.params.qmax) for name, tensor in qgraph.tensors.items()}
    for layer in qgraph.layers:
        bounds = _bounds_of(layer, ranges)
        if bounds is not None:
            for output in layer.outputs:
                qmin, qmax = ranges[output]
                ranges[output] = (max(qmin, bounds[0]), min(qmax, bounds[1]))
    return ranges


def _bounds_of(layer: QLayer, ranges: dict[str, tuple[int, int]]) -> tuple[int, int] | None:
    if isinstance(layer, QWeighted):
        return layer.output_min, layer.output_max
    if isinstance(layer, QClamp):
        low, high = ranges[layer.inputs[0]]
        return max(low, layer.low), min(high, layer.high)
    if isinstance(layer, QLookup):
        return int(layer.table.min()), int(layer.table.max())
    if isinstance(layer, QSelection):  # outputs are input values (pad: or its pad value)
        low, high = ranges[layer.inputs[0]]
        value = int(layer.op_attrs.get("value", low)) if layer.op == "pad" else low
        return min(low, value), max(high, value)
    return None


def layer_key(qgraph: QGraph, layer: QLayer, input_ranges: list[tuple[int, int]]) -> str:
    """A digest of everything tracing `layer` alone reads (not its name nor its tensors' names)."""
    digest = hashlib.sha256()
    quantization = [qgraph.tensors[name].params for name in (*layer.inputs, *layer.outputs)]
    description = {
        "op": layer.op,
        "attrs": layer.attrs(),
        "shapes": [qgraph.tensors[name].shape for name in layer.inputs],
        "quantization": [[p.scale, p.zero_point, p.dtype] for p in quantization],
        "input_ranges": input_ranges,
    }
    digest.update(json.dumps(description, sort_keys=True, default=str).encode())
    constants = {f"input{i}": qgraph.constants[name] for i, name in enumerate(layer.inputs) if name in qgraph.constants}
    for name, array in sorted({**layer.arrays(), **constants}.items()):
        array = np.ascontiguousarray(array)
        digest.update(f"{name}{array.dtype}{array.shape}".encode() + array.tobytes())
    return digest.hexdigest()
