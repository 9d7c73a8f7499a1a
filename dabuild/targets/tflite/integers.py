"""The QGraph as TFLite Micro computes the .tflite file written from it (`as_tflm`).

A .tflite file stores float32 scales, and TFLM derives every multiplier and shift from them when it prepares
each operator (in double precision, the products and quotients in the order its kernels write them); dabuild's
QGraph holds float64 scales and multipliers derived from those. The tflite target therefore writes, and its
check's integer reference runs, the QGraph with every scale rounded to float32 and every integer TFLM derives
recomputed from them, as TFLM does:

- conv, dense: s_in * s_w / s_out per channel; add/sub: TFLite's rescale to 2 max(s_a, s_b) with a left shift
  of 20 (15 for int16); mul: s_a * s_b / s_out; concat: s_i / s_out; softmax: its exp table from the float32
  input scale (the int16 softmax's rescale is TFLite's from the float32 scale already).
- TFLite's AVERAGE_POOL_2D keeps its input's params and never counts padding: a pool that requantizes is
  written as the pool into a tensor of its input's params and a QUANTIZE after it (a one-input concat here),
  and a pool that counts padding as an explicit pad before an unpadded pool.
- TFLM's MEAN over height and width kept as 1x1 runs another kernel than the other means: it is written
  without kept dimensions and reshaped after.

Weights and biases keep their integers. A given model's scales are float32 already (a .tflite file's), so for
it nothing changes but the layers split above.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from dabuild.qir.fixed_point import quantize_multiplier, round_half_away
from dabuild.qir.layers.elementwise import QAdd, QLookup, QMul
from dabuild.qir.layers.linear import QWeighted
from dabuild.qir.layers.pool import QAvgPool, QMean
from dabuild.qir.layers.shape import QConcat, QSelection
from dabuild.qir.layers.softmax import EXP_BITS, QSoftmax
from dabuild.qir.qgraph import LAYER_TYPES, QGraph, QLayer, QTensor
from dabuild.targets.tflm_functions import tflm_lookup

LEFT_SHIFTS = {"int8": 20, "int16": 15}   # TFLite's add/sub: the inputs' left shift by output type


def float32(value: float) -> float:
    return float(np.float32(value))


def as_tflm(qgraph: QGraph, rounding: str) -> QGraph:
    """`qgraph` with float32 scales, the integers TFLM derives from them, and `rounding`."""
    tensors = {name: QTensor(tensor.shape, dataclasses.replace(tensor.params, scale=float32(tensor.params.scale)))
               for name, tensor in qgraph.tensors.items()}
    graph = QGraph(qgraph.input, qgraph.output, tensors, [], dict(qgraph.constants), dict(qgraph.floats), rounding)
    for layer in qgraph.layers:
        graph.layers.extend(_as_tflm(layer, graph))
    return graph


def _scale(graph: QGraph, name: str) -> float:
    return graph.tensors[name].params.scale


def _as_tflm(layer: QLayer, graph: QGraph) -> list[QLayer]:
    if isinstance(layer, QWeighted):
        weight_scale = layer.weight_scale.astype(np.float32).astype(np.float64)
        real = _scale(graph, layer.inputs[0]) * weight_scale / _scale(graph, layer.outputs[0])
        multiplier, shift = quantize_multiplier(real, layer.name)
        return [dataclasses.replace(layer, weight_scale=weight_scale, multiplier=multiplier, shift=shift)]
    if isinstance(layer, QAdd):
        scales = np.array([_scale(graph, name) for name in layer.inputs])
        left_shift = LEFT_SHIFTS.get(graph.tensors[layer.outputs[0]].params.dtype, layer.left_shift)
        twice_max = 2 * float(scales.max())
        input_multiplier, input_shift = quantize_multiplier(scales / twice_max, layer.name)
        multiplier, shift = quantize_multiplier(twice_max / (2**left_shift * _scale(graph, layer.outputs[0])),
                                                layer.name)
        return [dataclasses.replace(layer, left_shift=left_shift, input_multiplier=input_multiplier,
                                    input_shift=input_shift, multiplier=multiplier, shift=shift)]
    if isinstance(layer, QMul):
        product = _scale(graph, layer.inputs[0]) * _scale(graph, layer.inputs[1]) / _scale(graph, layer.outputs[0])
        multiplier, shift = quantize_multiplier(product, layer.name)
        return [dataclasses.replace(layer, multiplier=multiplier, shift=shift)]
    if isinstance(layer, QConcat):
        scales = np.array([_scale(graph, name) for name in layer.inputs])
        multiplier, shift = quantize_multiplier(scales / _scale(graph, layer.outputs[0]), layer.name)
        return [dataclasses.replace(layer, multiplier=multiplier, shift=shift)]
    if isinstance(layer, QSoftmax) and layer.reciprocal_table is not None:
        return [layer]   # TFLite's int16 softmax: its rescale derives from the float32 scale already
    if isinstance(layer, QSoftmax):
        source = graph.tensors[layer.inputs[0]].params
        steps = np.arange(len(layer.exp_table), dtype=np.float64)
        table = round_half_away(np.exp(-source.scale * steps) * 2**EXP_BITS).astype(np.int32)
        return [dataclasses.replace(layer, exp_table=table)]
    if isinstance(layer, QLookup):
        return [tflm_lookup(layer, graph)]
    if isinstance(layer, QAvgPool):
        return _avg_pool(layer, graph)
    if isinstance(layer, QMean):
        return _mean(layer, graph)
    return [layer]


def _avg_pool(layer: QAvgPool, graph: QGraph) -> list[QLayer]:
    """The pool at its input's params (after an explicit pad where padding counts), requantized after."""
    [name], [output] = layer.inputs, layer.outputs
    source = graph.tensors[name]
    layers: list[QLayer] = []
    attrs = dict(layer.op_attrs)
    pads = list(attrs.get("pads") or [])
    if attrs.get("count_include_pad") and any(pads):
        padded = f"{name}:tflite_padded"
        spatial = len(pads) // 2
        shape = tuple(size + (pads[a - 1] + pads[a - 1 + spatial] if a > 0 else 0)
                      for a, size in enumerate(source.shape))
        graph.tensors[padded] = QTensor(shape, source.params)
        value = float(source.params.zero_point)
        pad_layer = _selection("pad")(name=f"{layer.name}:tflite_pad", inputs=[name], outputs=[padded],
                                       op_attrs={"pads": [0, 0, *pads[:spatial], 0, 0, *pads[spatial:]],
                                                 "mode": "constant", "value": value})
        layers.append(pad_layer)
        attrs.update(pads=[0] * len(pads), count_include_pad=False)
        name = padded
    if graph.tensors[output].params == source.params:
        return [*layers, dataclasses.replace(layer, inputs=[name], op_attrs=attrs)]
    pooled = f"{output}:tflite_pooled"
    graph.tensors[pooled] = QTensor(graph.tensors[output].shape, source.params)
    ones = np.ones(len(layer.multiplier))
    multiplier, shift = quantize_multiplier(ones / np.arange(1, len(ones) + 1), layer.name)
    requantize = _requantization(f"{layer.name}:tflite_requantize", pooled, output, graph)
    return [*layers, dataclasses.replace(layer, inputs=[name], outputs=[pooled], op_attrs=attrs,
                                         multiplier=multiplier, shift=shift), requantize]


def _selection(op: str) -> type[QSelection]:
    layer_class = LAYER_TYPES[op]
    assert issubclass(layer_class, QSelection)
    return layer_class


def _requantization(name: str, source: str, output: str, graph: QGraph) -> QConcat:
    """A one-input concat: `source` requantized to `output`'s params, as TFLite's QUANTIZE computes it."""
    multiplier, shift = quantize_multiplier(_scale(graph, source) / _scale(graph, output), name)
    return QConcat(name=name, inputs=[source], outputs=[output], axis=1, multiplier=multiplier, shift=shift)


def _mean(layer: QMean, graph: QGraph) -> list[QLayer]:
    """A 4-D mean over height and width kept as 1x1: the mean without kept dimensions, then a reshape."""
    [name], [output] = layer.inputs, layer.outputs
    spatial = len(graph.tensors[name].shape) == 3 and sorted(layer.axes) == [2, 3] and layer.keepdims
    if not spatial:
        return [layer]
    flat = f"{output}:tflite_mean"
    graph.tensors[flat] = QTensor(graph.tensors[output].shape[:1], graph.tensors[output].params)
    reshape = _selection("reshape")(name=f"{layer.name}:tflite_reshape", inputs=[flat], outputs=[output],
                                     op_attrs={"shape": [0, *graph.tensors[output].shape]})
    return [dataclasses.replace(layer, outputs=[flat], keepdims=False), reshape]
