"""Integer lowering: Graph + Stats + QuantConfig -> QGraph.

Each node is lowered by the function registered for its op (see
`dabuild.quant.lowering` and the layer modules of `dabuild.qir.layers`),
or, when its config is fp32 (`NodeConfig(weight=None, activation=None)`), by
the fp32 fallback: fp32 nodes form float islands, with quantization only at
their boundary (`dabuild.qir.layers.fallback`). Activation tensors get their quantization from the node
that produces them; the graph input takes the activation choice of its first
consumer that has one. Each choice's calibration algorithm picks the range
from the stored statistics; weights, known exactly, get theirs from a
histogram of the weight itself. With `bias_correction`, each dense and conv
bias also absorbs the mean error its quantized weights add on the calibration
data (see `dabuild.quant.bias_correction`). Quantization the model gives
(`dabuild.ir.given_quant`) replaces calibration where it is given: a tensor a
fake_quant node reads takes that node's parameters, a weight recorded in
`Graph.given` its integers and scales (see `dabuild.quant.given_params`).
"""

from __future__ import annotations

from dabuild.errors import BuildError
from dabuild.ir.graph import Graph
from dabuild.qir.fixed_point import quantize_multiplier
from dabuild.qir.qgraph import INDICES, QGraph, QLayer, QTensor
from dabuild.quant.calibrate import Stats
from dabuild.quant.config import QuantConfig
from dabuild.quant.given_params import given_tensor_params
from dabuild.quant.lowering import (
    FLOAT_ONLY,
    LOWERINGS,
    MINMAX_INT8,
    Lowering,
    WeightCache,
    activation_params,
    float_only_message,
    quantize_weight,
)
from dabuild.quant.lowerings.fallback import island_tensors, lower_fp32
from dabuild.quant.node_memo import NodeLowerings

__all__ = ["activation_params", "quantize", "quantize_multiplier", "quantize_weight"]


def quantize(graph: Graph, stats: Stats, config: QuantConfig, bias_correction: bool = False,
             weight_cache: WeightCache | None = None, integer_writers: frozenset[str] = frozenset(),
             memo: NodeLowerings | None = None) -> QGraph:
    """Lower a float graph with one input and one output to integer layers; with a `weight_cache`, weights
    lowered before under the same choice are taken from it (a tuning run's configs share most of them).
    `integer_writers`: the dense/convs that never hand an island a float result (`island_tensors`). With a
    `memo`, each node whose lowering reads what it read before takes the layers made then (shared: the graph
    is for measuring, never for changing), unless fake_quant nodes rename tensors (see `node_memo`)."""
    if len(graph.inputs) != 1 or len(graph.outputs) != 1:
        raise BuildError(f"integer lowering needs exactly one graph input and one output "
                         f"(got {len(graph.inputs)} and {len(graph.outputs)})")
    if not graph.nodes:
        raise BuildError("integer lowering: the graph has no nodes")
    for node in graph.nodes:
        if node.name not in config.nodes:
            raise BuildError(f"node {node.name!r}: the quantization config has no entry for it")
        if not config.nodes[node.name].fp32 and node.op in FLOAT_ONLY:
            raise BuildError(float_only_message(node.name, node.op))
        if not config.nodes[node.name].fp32 and node.op not in LOWERINGS:
            raise BuildError(f"node {node.name!r}: op {node.op!r} has no integer lowering "
                             f"(lowered ops: {', '.join(LOWERINGS.names())}); run it in fp32 on a target that can")

    if any(node.op == "fake_quant" for node in graph.nodes):
        memo = None
    shapes = graph.tensor_shapes() if memo is None else memo.tensor_shapes(graph)
    ctx = Lowering(graph, stats, shapes, {}, bias_correction=bias_correction,
                   island=island_tensors(graph, config, integer_writers), weight_cache=weight_cache)
    ctx.given.update(given_tensor_params(graph, config))
    spec = graph.inputs[0]
    choice = next((config.nodes[n.name].activation for n in graph.nodes
                   if spec.name in n.inputs and config.nodes[n.name].activation is not None), MINMAX_INT8)
    params = INDICES if spec.name in graph.integer_inputs() else ctx.calibrated(spec.name, choice)
    ctx.tensors[spec.name] = QTensor(ctx.sample_shape(spec.name), params)
    qlayers: list[QLayer] = []
    for node in graph.nodes:
        ctx.node, ctx.config = node, config.nodes[node.name]
        lowering = lower_fp32 if ctx.config.fp32 else LOWERINGS[node.op]
        qlayers.extend(lowering(ctx) if memo is None else memo.lower(ctx, lowering))
    return _renamed(QGraph(spec.name, graph.outputs[0], ctx.tensors, qlayers, ctx.constants, ctx.floats), ctx.renames)


def _renamed(qgraph: QGraph, renames: dict[str, str]) -> QGraph:
    """The graph with each tensor of `renames` called by its final name (fake_quants lowered to nothing)."""
    def final(name: str) -> str:
        while name in renames:
            name = renames[name]
        return name

    if not renames:
        return qgraph
    for layer in qgraph.layers:
        layer.inputs = [final(name) for name in layer.inputs]
        layer.outputs = [final(name) for name in layer.outputs]
    tensors = {name: tensor for name, tensor in qgraph.tensors.items() if final(name) == name}
    return QGraph(qgraph.input, final(qgraph.output), tensors, qgraph.layers, qgraph.constants, qgraph.floats)
