"""How each activation is lowered: a clamp in the quantized domain, or a lookup table.

relu, relu6 and clip are clamps: with a tensor's params, their bounds are two
integers, exact up to the rounding of the bounds themselves. Every other
elementwise activation (leaky_relu, sigmoid, tanh, hard_sigmoid, hard_swish,
gelu) is a function of one integer value, so it becomes a table of its
results for every value of the input's dtype (256 for int8, 65536 for int16),
computed at quantize time with the float op of dabuild.ir.ops: exact by
construction, and one load per value in C.

A table needs the params of its input. When conv or dense has such an
activation fused, that input (the pre-activation) is no tensor of the float
graph, so calibration runs `with_table_activations_split(graph)`, which
observes it under the name `pre_activation(output)`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from dabuild.ir.graph import Graph, Node
from dabuild.ir.ops import OPS, Activation
from dabuild.qir.qgraph import QuantParams

CLAMP_ACTIVATIONS = frozenset({"relu", "relu6", "clip"})
FUSING_OPS = frozenset({"dense", "conv"})


def is_table_activation(op: str) -> bool:
    return op not in CLAMP_ACTIVATIONS and isinstance(OPS.get(op), Activation)


def pre_activation(tensor: str) -> str:
    """The name of the tensor a fused table activation reads."""
    return f"{tensor}:pre_activation"


@dataclasses.dataclass(frozen=True)
class FusedActivation:
    """A dense/conv node's fused activation: its op and attrs, and the tensor the weighted layer writes (the
    node's output, or for a table activation the pre-activation the lookup layer reads)."""

    op: str
    attrs: dict[str, Any]
    written: str

    @property
    def table(self) -> bool:
        return is_table_activation(self.op)

    @classmethod
    def of(cls, node: Node) -> FusedActivation:
        op = node.attrs.get("activation", "none")
        return cls(op, dict(node.attrs.get("activation_attrs", {})),
                   pre_activation(node.outputs[0]) if is_table_activation(op) else node.outputs[0])


def clamp_bounds(op: str, attrs: dict[str, Any], params: QuantParams) -> tuple[int, int]:
    """[low, high] of a clamp activation ("none" too: the dtype's range) in the quantized domain of `params`."""
    real = {"none": (None, None), "relu": (0.0, None), "relu6": (0.0, 6.0)}
    low, high = real[op] if op in real else (attrs.get("min"), attrs.get("max"))

    def bound(value: float | None, default: int) -> int:
        return default if value is None else int(params.quantize(np.float32(value)))

    return bound(low, params.qmin), bound(high, params.qmax)


def lookup_table(op: str, attrs: dict[str, Any], source: QuantParams, target: QuantParams) -> np.ndarray:
    """table[q - qmin] = quantize(op(dequantize(q))) for every q of the source dtype."""
    real = source.dequantize(source.all_values())
    return target.quantize(OPS[op].run([real], attrs)[0])


def with_table_activations_split(graph: Graph) -> Graph:
    """The same graph, with each table activation fused into conv/dense moved into a node of its own.

    The new node reads `pre_activation(output)` and writes the original output,
    so every tensor of `graph` keeps its name and its values.
    """
    nodes: list[Node] = []
    for node in graph.nodes:
        activation = node.attrs.get("activation", "none")
        if node.op not in FUSING_OPS or not is_table_activation(activation):
            nodes.append(node)
            continue
        output = node.outputs[0]
        attrs = {**node.attrs, "activation": "none", "activation_attrs": {}}
        nodes.append(dataclasses.replace(node, outputs=[pre_activation(output)], attrs=attrs))
        nodes.append(Node(f"{node.name}:{activation}", activation, [pre_activation(output)], [output],
                          dict(node.attrs.get("activation_attrs", {}))))
    return Graph(graph.inputs, graph.outputs, nodes, graph.constants)
