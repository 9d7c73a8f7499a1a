"""One C kernel per integer op: its templates and the values its layer header needs.

A kernel `<op>` owns three templates: `<op>.h.j2` and `<op>.c.j2` (the kernel,
rendered once per artifact) and `<op>_layer.h.j2` (one layer's configuration
and constants). Every kernel is called as `<op>_s8(&params, in, out)`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from dabuild.errors import BuildError
from dabuild.quant.layers.elementwise import QRelu
from dabuild.quant.layers.linear import QDense
from dabuild.quant.qgraph import QGraph, QLayer


def _dense(layer: QDense, qgraph: QGraph) -> dict[str, Any]:
    output = qgraph.tensors[layer.outputs[0]].params
    source = qgraph.tensors[layer.inputs[0]]
    if len(source.shape) != 1 or layer.output_max != output.qmax:
        raise BuildError(f"layer {layer.name!r}: the C dense kernel takes one feature vector per sample and "
                         f"clamps only from below (relu); this layer has input shape {source.shape} and output "
                         f"bounds [{layer.output_min}, {layer.output_max}]")
    return {
        "in_features": layer.in_features,
        "out_features": layer.out_features,
        "channels": len(layer.multiplier),
        "input_zero_point": qgraph.tensors[layer.inputs[0]].params.zero_point,
        "output_zero_point": output.zero_point,
        "output_min": layer.output_min,
        "fused_relu": layer.output_min > output.qmin,
        "weight": np.ascontiguousarray(layer.weight.T),  # [out][in]: contiguous dot products
        "bias": layer.bias,
        "multiplier": layer.multiplier,
        "shift": layer.shift,
    }


def _relu(layer: QRelu, qgraph: QGraph) -> dict[str, Any]:
    source = qgraph.tensors[layer.inputs[0]]
    return {"size": source.size, "zero_point": source.params.zero_point}


LAYER_CONTEXT: dict[str, Callable[[Any, QGraph], dict[str, Any]]] = {"dense": _dense, "relu": _relu}


def layer_context(layer: QLayer, qgraph: QGraph) -> dict[str, Any]:
    if layer.op not in LAYER_CONTEXT:
        raise BuildError(f"layer {layer.name!r}: the C target has no kernel for op {layer.op!r} "
                         f"(kernels: {', '.join(sorted(LAYER_CONTEXT))})")
    return LAYER_CONTEXT[layer.op](layer, qgraph)
