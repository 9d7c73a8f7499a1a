"""A toy framework and its dabuild plugins: a tracer and a C target with hooks.

`LayerList` is the "framework": a list of (weight, bias, activation) tuples.
Its tracer is found by `type(model).__module__.split('.')[0]`, i.e. by this
package's name. `HookedCTarget` is dabuild's C target plus pre/post-trace hooks
that append to the file named by $DABUILD_TESTPLUGIN_LOG.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from dabuild.ir.graph import Graph, Node, TensorSpec
from dabuild.targets.c import CTarget
from dabuild.trace.base import TracerPlugin


@dataclass
class LayerList:
    layers: list[tuple[np.ndarray, np.ndarray, str]] = field(default_factory=list)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        for weight, bias, activation in self.layers:
            x = x @ weight + bias
            if activation == "relu":
                x = np.maximum(x, 0)
        return x


def build(weights: dict[str, np.ndarray]) -> LayerList:
    """Factory for recipes: the digits MLP's arrays as a LayerList."""
    names = sorted({key[1:] for key in weights if key.startswith("w")})
    return LayerList(
        [(weights[f"w{n}"], weights[f"b{n}"], "relu" if n != names[-1] else "none") for n in names]
    )


class LayerListTracer(TracerPlugin):
    def get_input_shapes(self) -> dict[str, tuple[int | None, ...]]:
        if self.inputs:
            return super().get_input_shapes()
        return {"x": (None, self.model.layers[0][0].shape[0])}

    def apply_model(self, inputs: dict[str, str]) -> list[Node]:
        nodes, current = [], inputs["x"]
        for index, (_, _, activation) in enumerate(self.model.layers):
            nodes.append(Node(f"layer{index}", "dense", [current, f"w{index}", f"b{index}"], [f"h{index}"],
                              {"activation": activation}))
            current = f"h{index}"
        return nodes

    def trace(self) -> Graph:
        (name, shape), = self.get_input_shapes().items()
        nodes = self.apply_model({"x": name})
        constants = {}
        for index, (weight, bias, _) in enumerate(self.model.layers):
            constants[f"w{index}"] = np.asarray(weight, np.float32)
            constants[f"b{index}"] = np.asarray(bias, np.float32)
        return Graph([TensorSpec(name, shape)], [nodes[-1].outputs[0]], nodes, constants)


def _log(line: str) -> None:
    with open(os.environ["DABUILD_TESTPLUGIN_LOG"], "a") as log:
        log.write(line + "\n")


class HookedCTarget(CTarget):
    kind = "hooked-c"

    def pre_trace(self, model_spec) -> None:
        _log(f"pre_trace {model_spec.source}")

    def post_trace(self, graph: Graph) -> None:
        _log(f"post_trace {len(graph.nodes)} nodes")
