"""QGraph layers as NNEF, one small function per layer op.

Two paths, chosen per layer:

- tract's quantized kernels: dense and conv whose weights have one scale
  (per tensor) read the QI8 form of their input, int8 weights declared
  quantized in graph.quant and int32 biases, and write a QI8 output whose
  scale and zero point graph.quant gives: tract's own integer arithmetic,
  as a tract deployment of a quantized model runs it. graph.quant holds one
  scale per tensor, so per-channel weights take the second path.
- fake-quant float: every other layer runs its float op (`float_ops`) on the
  real values of its inputs, with dequantized weights and biases, and puts
  the result on its output's grid (`Emitter.fake_quant`). Layers that only
  move or select values (layout ops, max pools, clamps) need no fake-quant:
  their outputs already lie on the grid.

A lookup layer (a table activation) is exported as the table itself: its
256 real values gathered by the input's integer index (`tract_core_gather`).
The table is quantize(f(dequantize(q))) for every q, so this is exactly the
fake-quant of f on that input, with no float function to approximate, and it
needs no attributes a table no longer keeps (leaky_relu's alpha, gelu's
approximation).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from dabuild.errors import BuildError
from dabuild.qir.layers.blocked import QBlockedDense
from dabuild.qir.layers.elementwise import QAdd, QClamp, QLookup, QMul, QPrelu
from dabuild.qir.layers.embedding import QEmbedding
from dabuild.qir.layers.fallback import QFloat, QFloatWeighted
from dabuild.qir.layers.linear import QConv, QConvTranspose, QDense, QWeighted, transposed_layout
from dabuild.qir.layers.matmul import QMatMul
from dabuild.qir.layers.pool import QAvgPool, QMean
from dabuild.qir.layers.resize import QResizeLinear
from dabuild.qir.layers.select import QPick, QWhere
from dabuild.qir.layers.shape import SELECTION_OPS, QConcat, QSelection
from dabuild.qir.layers.softmax import QSoftmax
from dabuild.qir.qgraph import QLayer, QuantParams
from dabuild.registry import Registry
from dabuild.targets.nnef.emitter import Emitter, number
from dabuild.targets.nnef.float_ops import Shape, emit_float, known_size, reduce

LayerExporter = Callable[[Emitter, Any, bool], None]
LAYER_EXPORTERS: Registry[LayerExporter] = Registry("quantized layer exporter", "the nnef target")


def exports(*ops: str) -> Callable[[LayerExporter], LayerExporter]:
    return LAYER_EXPORTERS.register(*ops)


def export_layer(e: Emitter, layer: QLayer, quantized_kernels: bool) -> None:
    if layer.op not in LAYER_EXPORTERS:
        raise BuildError(f"nnef export: layer {layer.name!r} ({layer.op}) has no NNEF exporter")
    LAYER_EXPORTERS[layer.op](e, layer, quantized_kernels)


def shape(e: Emitter, tensor: str) -> Shape:
    """Batch-first shape of a QGraph tensor or graph constant (constants have no batch axis of their own)."""
    if tensor in e.qgraph.constants:
        return tuple(e.qgraph.constants[tensor].shape)
    if tensor in e.qgraph.floats:
        return (None, *e.qgraph.floats[tensor])
    return (None, *e.qgraph.tensors[tensor].shape)


def grid_clamp(e: Emitter, value: str, params: QuantParams, low: int, high: int, base: str) -> str:
    """clamp at the real values of two grid points, as dequantize computes them."""
    bounds = params.dequantize(np.array([low, high]))
    return e.call(base, "clamp", value, number(bounds[0]), number(bounds[1]))


def uses_quantized_kernel(layer: QWeighted, quantized_kernels: bool) -> bool:
    return quantized_kernels and len(layer.weight_scale) == 1


def _float_op(e: Emitter, layer: QLayer, op: str, attrs: dict[str, Any], inputs: list[str] | None = None) -> str:
    names = inputs if inputs is not None else [e.real(name) for name in layer.inputs]
    return emit_float(e, op, names, attrs, [shape(e, name) for name in layer.inputs], f"{layer.outputs[0]}_float",
                      f"layer {layer.name!r}")[0]


def _finish(e: Emitter, layer: QLayer, value: str, low: int | None = None, high: int | None = None) -> None:
    """The layer's float result on its output's grid, as the real form of its output."""
    output = layer.outputs[0]
    e.set_real(output, e.fake_quant(value, e.params(output), output, low, high))


def _geometry(layer: QWeighted) -> dict[str, Any]:
    if isinstance(layer, QConv):
        return {"strides": layer.strides, "pads": layer.pads, "dilations": layer.dilations, "groups": layer.groups}
    return {}


def _tract_quantized(e: Emitter, layer: QWeighted) -> None:
    """tract's integer kernel: QI8 input, int8 weights (graph.quant), int32 bias, QI8 output."""
    output, target = layer.outputs[0], e.params(layer.outputs[0])
    weight = layer.weight.T if isinstance(layer, QDense) else layer.weight  # linear takes [out, in]
    inputs = [e.quantized(layer.inputs[0]),
              e.variable(f"{layer.name}_weight", weight, QuantParams(float(layer.weight_scale[0]), 0)),
              e.variable(f"{layer.name}_bias", layer.bias.reshape(1, -1))]
    if isinstance(layer, QDense):
        result = e.call(f"{output}_q", "linear", *inputs)
    else:
        result = emit_float(e, "conv", inputs, _geometry(layer), [shape(e, layer.inputs[0])], f"{output}_q",
                            f"layer {layer.name!r}")[0]
    e.quant[result] = target
    if (layer.output_min, layer.output_max) == (target.qmin, target.qmax):
        e.set_quantized(output, result)
        return
    real = e.call(f"{output}_unclamped", "tract_core_cast", result, to="'f32'")
    e.set_real(output, grid_clamp(e, real, target, layer.output_min, layer.output_max, output))


def _fake_quantized(e: Emitter, layer: QWeighted) -> None:
    """The float op on dequantized weights and bias, then onto the output grid within the fused clamp."""
    channel = [1] * layer.weight.ndim
    channel[1 if isinstance(layer, QDense) else 0] = -1
    weight = (layer.weight * layer.weight_scale.reshape(channel)).astype(np.float32)
    bias = (layer.bias * e.params(layer.inputs[0]).scale * layer.weight_scale).astype(np.float32)
    rank = len(shape(e, layer.inputs[0]))
    bias_shape = [1] * (rank - 1) + [-1] if isinstance(layer, QDense) else [1, -1]
    inputs = [e.real(layer.inputs[0]), e.variable(f"{layer.name}_weight", weight),
              e.variable(f"{layer.name}_bias", bias.reshape(bias_shape))]
    _finish(e, layer, _float_op(e, layer, layer.op, _geometry(layer), inputs), layer.output_min, layer.output_max)


@exports("dense", "conv")
def _weighted(e: Emitter, layer: QWeighted, quantized_kernels: bool) -> None:
    """tract's quantized linear takes 2-D inputs only; a dense over a longer shape runs fake-quant."""
    two_d = len(shape(e, layer.inputs[0])) == 2
    if uses_quantized_kernel(layer, quantized_kernels) and (isinstance(layer, QConv) or two_d):
        _tract_quantized(e, layer)
    else:
        _fake_quantized(e, layer)


@exports("blocked_dense")
def _blocked_dense(e: Emitter, layer: QBlockedDense, quantized_kernels: bool) -> None:
    """Fake-quant (graph.quant has one scale per tensor): the float dense on the weight dequantized block by
    block and the real bias, then onto the output grid within the fused clamp."""
    rank = len(shape(e, layer.inputs[0]))
    bias = layer.real_bias(e.params(layer.outputs[0])).astype(np.float32).reshape([1] * (rank - 1) + [-1])
    inputs = [e.real(layer.inputs[0]), e.variable(f"{layer.name}_weight", layer.dequantized_weight().astype(np.float32)),
              e.variable(f"{layer.name}_bias", bias)]
    _finish(e, layer, _float_op(e, layer, "dense", {}, inputs), layer.output_min, layer.output_max)


@exports("conv_transpose")
def _conv_transpose(e: Emitter, layer: QConvTranspose, quantized_kernels: bool) -> None:
    """Fake-quant: the float deconv on the dequantized weight (back in ONNX's layout) and bias."""
    channel = [-1, *[1] * (layer.weight.ndim - 1)]
    weight = transposed_layout((layer.weight * layer.weight_scale.reshape(channel)).astype(np.float32), layer.groups)
    bias = (layer.bias * e.params(layer.inputs[0]).scale * layer.weight_scale).astype(np.float32)
    inputs = [e.real(layer.inputs[0]), e.variable(f"{layer.name}_weight", weight), e.variable(f"{layer.name}_bias", bias)]
    attrs = {"strides": layer.strides, "pads": layer.pads, "dilations": layer.dilations, "groups": layer.groups,
             "output_padding": layer.output_padding}
    value = emit_float(e, "conv_transpose", inputs, attrs, [shape(e, layer.inputs[0]), weight.shape, bias.shape],
                       f"{layer.outputs[0]}_float", f"layer {layer.name!r}")[0]
    _finish(e, layer, value, layer.output_min, layer.output_max)


@exports("prelu")
def _prelu(e: Emitter, layer: QPrelu, quantized_kernels: bool) -> None:
    """Fake-quant float prelu with the slopes the layer's multipliers stand for."""
    source, target = e.params(layer.inputs[0]), e.params(layer.outputs[0])
    magnitude = layer.negative_multiplier.astype(np.float64) / 2.0 ** layer.negative_shift.astype(np.float64)
    slope = (layer.sign * magnitude * target.scale / source.scale).astype(np.float32)
    names = [e.real(layer.inputs[0]), e.variable(f"{layer.name}_slope", slope)]
    _finish(e, layer, emit_float(e, "prelu", names, {}, [shape(e, layer.inputs[0]), slope.shape],
                                 f"{layer.outputs[0]}_float", f"layer {layer.name!r}")[0])


@exports("relu", "clamp")
def _clamp(e: Emitter, layer: QClamp, quantized_kernels: bool) -> None:
    """A clamp of values on the grid at two grid points: exact in float, no fake-quant needed."""
    e.set_real(layer.outputs[0], grid_clamp(e, e.real(layer.inputs[0]), e.params(layer.inputs[0]), layer.low,
                                            layer.high, layer.outputs[0]))


@exports("lookup")
def _lookup(e: Emitter, layer: QLookup, quantized_kernels: bool) -> None:
    source = e.params(layer.inputs[0])
    output = layer.outputs[0]
    steps = e.call(f"{output}_steps", "round", e.call(f"{output}_scaled", "div", e.real(layer.inputs[0]),
                                                       number(source.scale)))
    offset = e.call(f"{output}_offset", "sub", steps, number(source.qmin - source.zero_point))  # q - qmin
    index = e.call(f"{output}_index", "tract_core_cast", offset, to="'i64'")
    table = e.variable(f"{layer.name}_table", e.params(layer.outputs[0]).dequantize(layer.table))
    e.set_real(layer.outputs[0], e.call(layer.outputs[0], "tract_core_gather", table, index, axis="0"))


@exports("embedding")
def _embedding(e: Emitter, layer: QEmbedding, quantized_kernels: bool) -> None:
    """The table's real values gathered at the token ids: per tensor exactly the output (its params are the
    table's); per row put on the output's grid, as the reference requantizes each row."""
    output, params = layer.outputs[0], e.params(layer.outputs[0])
    scales = layer.weight_scale.reshape(-1, *(1,) * (layer.weight.ndim - 1))
    real = params.dequantize(layer.weight) if not layer.per_row else (layer.weight * scales).astype(np.float32)
    rows = e.call(f"{output}_rows" if layer.per_row else output, "tract_core_gather",
                  e.variable(f"{layer.name}_table", real), e.real(layer.inputs[0]), axis="0")
    e.set_real(output, e.fake_quant(rows, params, output) if layer.per_row else rows)


@exports("add", "sub", "mul", "max", "min", "matmul")
def _binary(e: Emitter, layer: QAdd | QMul | QPick | QMatMul, quantized_kernels: bool) -> None:
    _finish(e, layer, _float_op(e, layer, layer.op, {}))


@exports("where")
def _where(e: Emitter, layer: QWhere, quantized_kernels: bool) -> None:
    condition = e.variable(f"{layer.name}_condition", layer.condition.astype(np.float32))
    names = [condition, *(e.real(name) for name in layer.inputs)]
    shapes = [tuple(layer.condition.shape), *(shape(e, name) for name in layer.inputs)]
    _finish(e, layer, emit_float(e, "where", names, {}, shapes, f"{layer.outputs[0]}_float",
                                 f"layer {layer.name!r}")[0])


@exports("avg_pool", "resize_linear")
def _avg_pool(e: Emitter, layer: QAvgPool | QResizeLinear, quantized_kernels: bool) -> None:
    """Layers that keep their float op's attributes: that op, fake-quantized."""
    _finish(e, layer, _float_op(e, layer, "resize" if layer.op == "resize_linear" else "avg_pool", layer.op_attrs))


@exports("mean")
def _mean(e: Emitter, layer: QMean, quantized_kernels: bool) -> None:
    """Sums and means share the layer; its multiplier s_x / (divisor * s_y) says which (divisor count or 1)."""
    dims = shape(e, layer.inputs[0])
    count = math.prod(known_size(dims, a, layer.name) for a in layer.axes)
    params_in, params_out = e.params(layer.inputs[0]), e.params(layer.outputs[0])
    divisor = params_in.scale / (layer.multiplier[0] / 2.0 ** int(layer.shift[0]) * params_out.scale)
    fragment = "mean_reduce" if abs(divisor - count) < abs(divisor - 1) else "sum_reduce"
    value = reduce(e, fragment, e.real(layer.inputs[0]), layer.axes,
                   layer.keepdims, f"{layer.outputs[0]}_float")
    _finish(e, layer, value)


@exports("softmax")
def _softmax(e: Emitter, layer: QSoftmax, quantized_kernels: bool) -> None:
    _finish(e, layer, _float_op(e, layer, "softmax", {"axis": layer.axis}))


@exports("concat")
def _concat(e: Emitter, layer: QConcat, quantized_kernels: bool) -> None:
    _finish(e, layer, _float_op(e, layer, "concat", {"axis": layer.axis}))


@exports(*SELECTION_OPS)
def _selection(e: Emitter, layer: QSelection, quantized_kernels: bool) -> None:
    """Layout ops and max ops select values: on the real form they stay on the grid."""
    attrs = dict(layer.op_attrs)
    if layer.op == "pad" and attrs["mode"] == "constant":  # the lowering stored the quantized pad value
        params = e.params(layer.inputs[0])
        attrs["value"] = float(params.dequantize(np.array(attrs["value"])))
    names = emit_float(e, layer.op, [e.real(layer.inputs[0])], attrs, [shape(e, layer.inputs[0])],
                       layer.outputs[0], f"layer {layer.name!r}")
    for output, name in zip(layer.outputs, names):
        e.set_real(output, name)


def _island_outputs(e: Emitter, layer: QLayer, names: list[str]) -> None:
    """A float island's results: fake-quantized where they leave the island, float inside it."""
    for output, name in zip(layer.outputs, names):
        e.set_real(output, name if output in e.qgraph.floats else e.fake_quant(name, e.params(output), output))


@exports("float")
def _float(e: Emitter, layer: QFloat, quantized_kernels: bool) -> None:
    """A float island's node: the IR op on real inputs and float constants."""
    names = emit_float(e, layer.float_op, [e.real(name) for name in layer.inputs], layer.op_attrs,
                       [shape(e, name) for name in layer.inputs], f"{layer.outputs[0]}_float",
                       f"layer {layer.name!r}")
    _island_outputs(e, layer, names)


@exports("float_weighted")
def _float_weighted(e: Emitter, layer: QFloatWeighted, quantized_kernels: bool) -> None:
    """A dense or conv feeding a float island: its dequantized weights and float bias, a float result."""
    rank = len(shape(e, layer.inputs[0]))
    bias_shape = [1] * (rank - 1) + [-1] if layer.float_op == "dense" else [1, -1]
    inputs = [e.real(layer.inputs[0]), e.variable(f"{layer.name}_weight", layer.real_weight()),
              e.variable(f"{layer.name}_bias", layer.bias.astype(np.float32).reshape(bias_shape))]
    _island_outputs(e, layer, [_float_op(e, layer, layer.float_op, layer.op_attrs, inputs)])
