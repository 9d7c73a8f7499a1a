"""A QGraph as a QDQ ONNX model: float ops between QuantizeLinear/DequantizeLinear pairs.

Every quantized tensor of the QGraph appears three times: the float value the
op computes (`T/float`), its QuantizeLinear output (`T/int8`, the tensor's
integers, with the QGraph's scale and zero point) and the DequantizeLinear
output the next ops read (`T` itself, so the model's output keeps the QGraph's
name; the float graph input `x` is read as `x/real`). Weights are int8
initializers (per tensor, or per output channel: axis 0 of a conv weight,
axis 1 of a dense (in, out) weight) behind a DequantizeLinear, and biases as
float32 (the int32 bias times s_in * s_w), which onnxruntime's QDQ optimizer
quantizes back to the same int32 when it fuses the layer into its integer
kernels (QLinearConv, QGemm, ...).

The ops between are written by the float exporter's op writers
(`dabuild.targets.onnx_float`), from an IR node rebuilt out of each layer:
clamps fused into dense/conv become Relu or Clip at their dequantized bounds
(quantizing clip(y) equals clamping the quantized y, so they stay exact); an
fp32 layer (a float island's) is its float op on float inputs: integer
ones dequantized by plain Cast/Sub/Mul, so onnxruntime's QDQ fusions cannot
turn the island into a quantized kernel (`QdqWriter.island_read`); a lookup table becomes its
float activation when that op with its default attributes reproduces the
table, otherwise an exact int8 Gather from the table. The integer reference
rounds half away from zero with Q31 multipliers, onnxruntime rounds half to
even in float, so the two agree to about one quantization step, not bit for
bit.

For a CPU whose u8s8 kernels saturate (`isa.saturates`: x86-64 without VNNI), a dense, conv or transposed
conv whose integer weights reach beyond +-64 is written with uint8 weights (the int8 ones plus 128, zero
point 128): onnxruntime runs those with its u8u8 kernels, which widen before multiplying and so are exact,
where its u8s8 ones would clip a pair of products to int16. Weights within +-64 stay int8 (u8s8 is exact
for them, and faster). The model's metadata names the isa it was written for and the layers widened so.

The model is written for opset 17 (what the op writers spell) and converted
to a later opset on request; its IR version is the lowest that opset allows.
The model's metadata maps each QGraph tensor to its `/int8` name, which is how
a per-layer trace finds them.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, version_converter

import dabuild
from dabuild.errors import BuildError
from dabuild.ir.graph import Node
from dabuild.ir.ops import OPS
from dabuild.qir.activations import lookup_table
from dabuild.qir.content import extremes
from dabuild.qir.fixed_point import quantize_multiplier
from dabuild.qir.layers.blocked import QBlockedDense
from dabuild.qir.layers.embedding import QEmbedding
from dabuild.qir.layers.fallback import QFloatWeighted
from dabuild.qir.layers.linear import QWeighted, transposed_layout
from dabuild.qir.layers.shape import SELECTION_OPS
from dabuild.qir.qgraph import INDICES, QGraph, QLayer, QuantParams
from dabuild.registry import Registry
from dabuild.targets.onnx.isa import SAFE_WEIGHT, resolve, saturates
from dabuild.targets.onnx_float import EXPORTERS, IR_VERSION, OPSET, Emitter, value_info

QUANTIZED_TENSORS = "dabuild.quantized_tensors"  # metadata key: QGraph tensor -> name of its integers
ISA = "dabuild.isa"  # metadata key: the instruction set the model was written for
UINT8_WEIGHTS = "dabuild.uint8_weights"  # metadata key: layers whose weights are uint8 so u8s8 cannot saturate
ONNX_TYPES = {"int8": TensorProto.INT8, "uint8": TensorProto.UINT8, "int16": TensorProto.INT16,
              "int32": TensorProto.INT32}
INT16_OPSET = 21  # the first opset whose QuantizeLinear and DequantizeLinear take int16 (onnxruntime runs them)


def _scalar_or_vector(values: np.ndarray, dtype: type) -> np.ndarray:
    """A per-tensor parameter as a scalar, a per-channel one as a vector (what QDQ's axis rule expects)."""
    values = np.asarray(values, dtype)
    return values.reshape(()) if values.size == 1 else values.reshape(-1)


class QdqWriter:
    """The state of one export: the emitter, and for each QGraph tensor the names it has in the model."""

    def __init__(self, qgraph: QGraph, saturating: bool = False, make_nodes: bool = True):
        self.qgraph = qgraph
        self.saturating = saturating  # onnxruntime's u8s8 kernels can saturate where the model will run
        self.uint8_weights: list[str] = []  # layers whose weights are uint8, so u8s8 cannot saturate them
        self.emitter = Emitter({*qgraph.tensors, *qgraph.constants}, make_nodes)
        self.real: dict[str, str] = {}       # tensor -> the float name ops read
        self.integers: dict[str, str] = {}   # tensor -> the name of its quantized values
        self._pending: list[tuple[str, str, bool]] = []  # (tensor, name written, is it already quantized)
        self._param_names: dict[str, list[str]] = {}
        self._island_inputs: dict[str, str] = {}  # integer tensor -> its float value as islands read it
        self.weights: list[str] = []  # the integer weights' initializers

    # Quantize / dequantize pairs

    def _params(self, tensor: str) -> list[str]:
        """Scale and zero point initializers of `tensor`, shared by its QuantizeLinear and DequantizeLinear."""
        if tensor not in self._param_names:
            params = self.qgraph.tensors[tensor].params
            self._param_names[tensor] = [
                self.emitter.constant(params.scale, np.float32, f"{tensor}/scale"),
                self.emitter.constant(params.zero_point, np.dtype(params.dtype).type, f"{tensor}/zero_point")]
        return self._param_names[tensor]

    def _dequantize(self, tensor: str, integers: str, real: str) -> None:
        self.integers[tensor], self.real[tensor] = integers, real
        self.emitter.add("DequantizeLinear", [integers, *self._params(tensor)], [real], f"{tensor}/dequantize")

    def quantize(self, tensor: str, source: str, real: str) -> None:
        """QuantizeLinear of the float `source` into `tensor`'s integers, dequantized into `real`."""
        integers = self.emitter.fresh(f"{tensor}/int8")
        self.emitter.add("QuantizeLinear", [source, *self._params(tensor)], [integers], f"{tensor}/quantize")
        self._dequantize(tensor, integers, real)

    def read(self, tensor: str) -> str:
        """The float name a layer reads `tensor` by; constants become initializers on first use."""
        if tensor not in self.real and tensor not in self.qgraph.floats:
            values = self.qgraph.constants[tensor]
            if tensor in self.qgraph.tensors:  # an int8 constant (an addend, say): integers behind a dequantize
                self._dequantize(tensor, self.emitter.initializer(self.emitter.fresh(f"{tensor}/int8"), values), tensor)
            else:  # a float constant of an fp32-fallback layer
                self.real[tensor] = self.emitter.initializer(tensor, values)
        return self.real[tensor]

    def island_read(self, tensor: str) -> str:
        """The float name a float island's layer reads `tensor` by: an integer tensor is dequantized by Cast,
        Sub and Mul, not by a DequantizeLinear, so onnxruntime's QDQ fusions (which quantize a float conv's
        weight themselves when a DequantizeLinear feeds it and a QuantizeLinear follows) find no pattern."""
        if tensor not in self.qgraph.tensors or tensor in self.qgraph.constants:
            return self.read(tensor)
        if tensor not in self._island_inputs:
            self.read(tensor)
            params, e = self.qgraph.tensors[tensor].params, self.emitter
            wide, centred, real = (e.fresh(f"{tensor}/island/{part}") for part in ("cast", "centred", "real"))
            e.add("Cast", [self.integers[tensor]], [wide], f"{tensor}/island/cast", to=TensorProto.FLOAT)
            e.add("Sub", [wide, e.constant(float(params.zero_point), np.float32, f"{tensor}/island/zero_point")],
                  [centred], f"{tensor}/island/centre")
            e.add("Mul", [centred, e.constant(params.scale, np.float32, f"{tensor}/island/scale")], [real],
                  f"{tensor}/island/scale")
            self._island_inputs[tensor] = real
        return self._island_inputs[tensor]

    def output(self, tensor: str) -> str:
        """The name a layer writes the float value of its output `tensor` to (quantized after the layer, unless
        it is a float island's tensor: that one the next float op reads as it is)."""
        name = self.emitter.fresh(f"{tensor}/float")
        if tensor in self.qgraph.floats:
            self.real[tensor] = name
        else:
            self._pending.append((tensor, name, False))
        return name

    def integer_output(self, tensor: str) -> str:
        """The name a layer writes `tensor`'s integers to directly (only dequantized after the layer)."""
        name = self.emitter.fresh(f"{tensor}/int8")
        self._pending.append((tensor, name, True))
        return name

    def finish_layer(self) -> None:
        for tensor, name, quantized in self._pending:
            if quantized:
                self._dequantize(tensor, name, tensor)
            else:
                self.quantize(tensor, name, tensor)
        self._pending.clear()

    # What layers use

    def node(self, op: str, layer: QLayer, inputs: list[str], attrs: dict[str, Any]) -> None:
        """The IR op `op` on `inputs`, writing the layer's outputs, through the float exporter's op writer."""
        node = Node(layer.name, op, inputs, [self.output(name) for name in layer.outputs], attrs)
        EXPORTERS[op](self.emitter, node, OPS[op].resolve(attrs))

    def weight(self, layer: QWeighted | QFloatWeighted | QEmbedding, axis: int, integer_kernel: bool = False) -> str:
        """The layer's int8 weight behind a DequantizeLinear (per channel along `axis` when it has many scales).

        `integer_kernel`: onnxruntime fuses the layer into a u8s8 integer kernel; where that can saturate and
        the weights reach beyond +-SAFE_WEIGHT, they are written as uint8 (plus 128, zero point 128)."""
        e = self.emitter
        scale = _scalar_or_vector(layer.weight_scale, np.float32)
        if integer_kernel and self.saturating and layer.weight.size and _peak(layer.weight) > SAFE_WEIGHT:
            self.uint8_weights.append(layer.name)
            inputs = [e.initializer(e.fresh(f"{layer.name}/weight"), (layer.weight.astype(np.int32) + 128).astype(np.uint8)),
                      e.constant(scale, np.float32, f"{layer.name}/weight_scale"),
                      e.constant(np.full(scale.shape, 128), np.uint8, f"{layer.name}/weight_zero_point")]
        else:
            inputs = [e.initializer(e.fresh(f"{layer.name}/weight"), layer.weight),
                      e.constant(scale, np.float32, f"{layer.name}/weight_scale")]  # zero point: 0 by default
            self.weights.append(inputs[0])
        real = e.fresh(f"{layer.name}/weight/real")
        e.add("DequantizeLinear", inputs, [real], f"{layer.name}/weight/dequantize", axis=axis if scale.ndim else None)
        return real

    def bias(self, layer: QWeighted) -> str:
        """The bias as float32: the int32 bias times s_in * s_w, as a DequantizeLinear of it would compute.

        onnxruntime quantizes a float bias between a dequantized input and weight back to the same int32
        when it fuses the layer (round(b / (s_in * s_w)) recovers it: |bias| << 2**24), and adds it as it
        is where it does not; stored like this it costs 4 bytes a channel, not 8 (int32 and a scale).
        """
        scale = layer.params(self.qgraph).scale * layer.weight_scale.astype(np.float32)
        real = (layer.bias.astype(np.float32) * np.asarray(scale, np.float32)).astype(np.float32)
        return self.emitter.initializer(self.emitter.fresh(f"{layer.name}/bias"), real)


    def dequantized_bias(self, layer: QWeighted) -> str:
        """The int32 bias behind a DequantizeLinear with scale s_in * s_w (per channel: axis 0): the QDQ
        pattern onnxruntime fuses into an integer kernel where it has one for the op but does not recover
        from a float bias (ConvTranspose: a float bias leaves it a float conv, up to 2 steps off after it)."""
        e = self.emitter
        scale = _scalar_or_vector(layer.params(self.qgraph).scale * layer.weight_scale, np.float32)
        inputs = [e.initializer(e.fresh(f"{layer.name}/bias"), layer.bias.astype(np.int32)),
                  e.constant(scale, np.float32, f"{layer.name}/bias_scale"),
                  e.constant(np.zeros_like(scale, np.int32), np.int32, f"{layer.name}/bias_zero_point")]
        real = e.fresh(f"{layer.name}/bias/real")
        e.add("DequantizeLinear", inputs, [real], f"{layer.name}/bias/dequantize", axis=0 if scale.ndim else None)
        return real


LayerWriter = Callable[[QdqWriter, Any], None]
WRITERS: Registry[LayerWriter] = Registry("QDQ writer", "the onnx target")


def writes(*ops: str) -> Callable[[LayerWriter], LayerWriter]:
    """Register a function as the QDQ writer of the QGraph layer ops `ops`."""
    return WRITERS.register(*ops)


def clamp_activation(params: QuantParams, low: int, high: int) -> dict[str, Any]:
    """The fused-activation attrs of an IR dense/conv that clamps to [low, high] of `params`' integers."""
    if low <= params.qmin and high >= params.qmax:
        return {"activation": "none", "activation_attrs": {}}
    if low == params.zero_point and high >= params.qmax:
        return {"activation": "relu", "activation_attrs": {}}

    def bound(value: int, limit: int) -> float | None:
        return None if value == limit else float(params.dequantize(np.int32(value)))

    return {"activation": "clip", "activation_attrs": {"min": bound(low, params.qmin), "max": bound(high, params.qmax)}}


@writes("dense", "conv")
def _weighted(w: QdqWriter, layer: Any) -> None:
    geometry = ({"strides": layer.strides, "pads": layer.pads, "dilations": layer.dilations, "groups": layer.groups}
                if layer.op == "conv" else {})
    inputs = [w.read(layer.inputs[0]), w.weight(layer, axis=0 if layer.op == "conv" else 1, integer_kernel=True),
              w.bias(layer)]
    activation = clamp_activation(layer.output_params(w.qgraph), layer.output_min, layer.output_max)
    w.node(layer.op, layer, inputs, {**geometry, **activation})


@writes("blocked_dense")
def _blocked_dense(w: QdqWriter, layer: QBlockedDense) -> None:
    """The weight as the file gave it: integers behind a blocked DequantizeLinear (opset 21: one scale per block
    of `block_size` inputs and output, axis 0), then the float dense; the bias in float (its int64 integers times
    s_y * 2**-shift)."""
    e, target = w.emitter, layer.output_params(w.qgraph)
    weight = e.initializer(e.fresh(f"{layer.name}/weight"), layer.weight)
    w.weights.append(weight)
    scale = e.initializer(e.fresh(f"{layer.name}/weight_scale"), layer.weight_scale.astype(np.float32))
    real = e.fresh(f"{layer.name}/weight/real")
    e.add("DequantizeLinear", [weight, scale], [real], f"{layer.name}/weight/dequantize", axis=0,
          block_size=layer.block_size)
    bias = e.initializer(e.fresh(f"{layer.name}/bias"), layer.real_bias(target).astype(np.float32))
    inputs = [w.read(layer.inputs[0]), real, bias]
    w.node("dense", layer, inputs, clamp_activation(target, layer.output_min, layer.output_max))


@writes("conv_transpose")
def _conv_transpose(w: QdqWriter, layer: Any) -> None:
    """ONNX's weight layout (C, O/groups, *kernel) has the output channels on axis 1 only without groups; a
    grouped per-channel weight is written as its dequantized float values (the numbers DequantizeLinear gives)."""
    e = w.emitter
    onnx_weight = transposed_layout(layer.weight, layer.groups)
    if layer.groups == 1 or len(layer.weight_scale) == 1:
        weight = w.weight(dataclasses.replace(layer, weight=onnx_weight), axis=1, integer_kernel=True)
    else:
        scales = transposed_layout(np.broadcast_to(layer.weight_scale.reshape(-1, *[1] * (layer.weight.ndim - 1)),
                                                   layer.weight.shape), layer.groups)
        weight = e.initializer(e.fresh(f"{layer.name}/weight/real"), (onnx_weight * scales).astype(np.float32))
    inputs = [w.read(layer.inputs[0]), weight, w.dequantized_bias(layer)]
    activation = clamp_activation(layer.output_params(w.qgraph), layer.output_min, layer.output_max)
    geometry = {"strides": layer.strides, "pads": layer.pads, "dilations": layer.dilations, "groups": layer.groups,
                "output_padding": layer.output_padding}
    if activation["activation"] == "none":
        w.node("conv_transpose", layer, inputs, geometry)
        return
    raw = e.fresh(f"{layer.name}/linear")
    node = Node(layer.name, "conv_transpose", inputs, [raw], geometry)
    EXPORTERS["conv_transpose"](e, node, OPS["conv_transpose"].resolve(geometry))
    w.node(activation["activation"], dataclasses.replace(layer, inputs=[raw]), [raw], activation["activation_attrs"])


@writes("relu", "clamp")
def _clamp(w: QdqWriter, layer: Any) -> None:
    activation = clamp_activation(layer.params(w.qgraph), layer.low, layer.high)
    op = "identity" if activation["activation"] == "none" else activation["activation"]
    w.node(op, layer, [w.read(layer.inputs[0])], activation["activation_attrs"])


@writes("lookup")
def _lookup(w: QdqWriter, layer: Any) -> None:
    source, target = layer.params(w.qgraph), layer.output_params(w.qgraph)
    if not OPS[layer.function].required and np.array_equal(
            lookup_table(layer.function, OPS[layer.function].resolve({}), source, target), layer.table):
        w.node(layer.function, layer, [w.read(layer.inputs[0])], {})
        return
    # A table the float op's default attributes do not reproduce: index it with the integers themselves.
    e, name = w.emitter, layer.name
    w.read(layer.inputs[0])
    wide, index = e.fresh(f"{name}/int32"), e.fresh(f"{name}/index")
    e.add("Cast", [w.integers[layer.inputs[0]]], [wide], name, to=TensorProto.INT32)
    e.add("Sub", [wide, e.constant(source.qmin, np.int32, f"{name}/qmin")], [index], name)
    table = e.initializer(e.fresh(f"{name}/table"), layer.table)
    e.add("Gather", [table, index], [w.integer_output(layer.outputs[0])], name, axis=0)


@writes("add", "sub", "mul", "max", "min", "matmul")
def _binary(w: QdqWriter, layer: Any) -> None:
    w.node(layer.op, layer, [w.read(name) for name in layer.inputs], {})


@writes("prelu")
def _prelu(w: QdqWriter, layer: Any) -> None:
    """The float prelu with the real slopes (sign times |slope|, from the layer's own multipliers' source)."""
    source, target = layer.params(w.qgraph), layer.output_params(w.qgraph)
    magnitude = layer.negative_multiplier.astype(np.float64) / 2.0 ** layer.negative_shift.astype(np.float64)
    slope = (layer.sign * magnitude * target.scale / source.scale).astype(np.float32)
    slope_name = w.emitter.initializer(w.emitter.fresh(f"{layer.name}/slope"), slope)
    w.node("prelu", layer, [w.read(layer.inputs[0]), slope_name], {})


@writes("where")
def _where(w: QdqWriter, layer: Any) -> None:
    condition = w.emitter.initializer(w.emitter.fresh(f"{layer.name}/condition"), layer.condition)
    w.node("where", layer, [condition, *(w.read(name) for name in layer.inputs)], {})


@writes("avg_pool", "resize_linear")
def _float_op_of(w: QdqWriter, layer: Any) -> None:
    """Layers that keep their float op's attributes: that op on the dequantized input."""
    op = {"avg_pool": "avg_pool", "resize_linear": "resize"}[layer.op]
    w.node(op, layer, [w.read(layer.inputs[0])], layer.op_attrs)


@writes("mean")
def _mean(w: QdqWriter, layer: Any) -> None:
    """QMean is a sum requantized by s_x / (divisor * s_y): a mean when the divisor is the count, else a sum."""
    source, target = layer.params(w.qgraph), layer.output_params(w.qgraph)
    shape = w.qgraph.tensors[layer.inputs[0]].shape
    count = math.prod(shape[axis - 1] for axis in layer.axes)

    def lowered_with(divisor: int) -> bool:
        multiplier, shift = quantize_multiplier(source.scale / (divisor * target.scale), layer.name)
        return np.array_equal(multiplier, layer.multiplier) and np.array_equal(shift, layer.shift)

    op = "reduce_mean" if lowered_with(count) else "reduce_sum" if lowered_with(1) else None
    if op is None:
        raise BuildError(f"layer {layer.name!r}: its multiplier is neither a mean's nor a sum's; "
                         "the onnx target cannot name its float op")
    w.node(op, layer, [w.read(layer.inputs[0])], {"axes": layer.axes, "keepdims": layer.keepdims})


@writes("embedding")
def _embedding(w: QdqWriter, layer: Any) -> None:
    """Per tensor: an exact int8 Gather from the table (the output carries its params). Per row: Gather from the
    table dequantized per row, the picked rows quantized to the output's params (rounding as onnxruntime does)."""
    ids = w.read(layer.inputs[0])
    if layer.per_row:
        w.node("embedding", layer, [ids, w.weight(layer, axis=0)], {})
        return
    e = w.emitter
    table = e.initializer(e.fresh(f"{layer.name}/weight"), layer.weight)  # int8 kept: Gather reads it
    e.add("Gather", [table, ids], [w.integer_output(layer.outputs[0])], layer.name, axis=0)


@writes("softmax", "concat")
def _axis(w: QdqWriter, layer: Any) -> None:
    w.node(layer.op, layer, [w.read(name) for name in layer.inputs], {"axis": layer.axis})


@writes(*SELECTION_OPS)
def _selection(w: QdqWriter, layer: Any) -> None:
    attrs = layer.op_attrs
    if layer.op == "pad" and attrs["mode"] == "constant":  # the lowering stored the quantized pad value
        attrs = {**attrs, "value": float(layer.params(w.qgraph).dequantize(np.int32(attrs["value"])))}
    w.node(layer.op, layer, [w.read(layer.inputs[0])], attrs)


@writes("float")
def _float(w: QdqWriter, layer: Any) -> None:
    if layer.float_op not in EXPORTERS:
        raise BuildError(f"layer {layer.name!r}: fp32 op {layer.float_op!r} has no ONNX spelling")
    w.node(layer.float_op, layer, [w.island_read(name) for name in layer.inputs], layer.op_attrs)


@writes("float_weighted")
def _float_weighted(w: QdqWriter, layer: Any) -> None:
    """A dense or conv feeding a float island: its integer weights behind a DequantizeLinear, a float bias, and
    a float output no QuantizeLinear follows (so no QDQ fusion can requantize it)."""
    bias = w.emitter.initializer(w.emitter.fresh(f"{layer.name}/bias"), layer.bias.astype(np.float32))
    w.node(layer.float_op, layer, [w.island_read(layer.inputs[0]), w.weight(layer, axis=layer.weight_axis), bias],
           layer.op_attrs)


INT4_OPSET = 21  # the first opset whose DequantizeLinear reads INT4 (onnxruntime >= 1.20 runs it)
BLOCKED_OPSET = 21  # and the first whose DequantizeLinear takes block_size


def _peak(values: np.ndarray) -> int:
    """The greatest |value| of a non-empty integer array, from its extremes (found once per cached weight)."""
    low, high = extremes(values)
    return max(-low, high)


def fits_int4(values: np.ndarray) -> bool:
    if not values.size:
        return False
    low, high = extremes(values)
    return low >= -8 and high <= 7


def narrow_weights(qgraph: QGraph) -> bool:
    """Does any layer hold weights of 4 bits or fewer? (An int8 weight always reaches +-127 at its peak.)"""
    return any(isinstance(weight := getattr(layer, "weight", None), np.ndarray) and fits_int4(weight)
               for layer in qgraph.layers)


def _pack_int4(model: onnx.ModelProto, weights: list[str]) -> None:
    """Weights whose integers fit int4 as INT4 initializers, two values a byte (their DequantizeLinear has no
    zero point: 0 of the weight's own type)."""
    import ml_dtypes  # onnx's own dependency for its 4-bit types

    initializers = {tensor.name: tensor for tensor in model.graph.initializer}
    for weight in weights:
        values = onnx.numpy_helper.to_array(initializers[weight])
        if fits_int4(values):
            initializers[weight].CopyFrom(onnx.numpy_helper.from_array(values.astype(ml_dtypes.int4), weight))


def initializer_bytes(model: onnx.ModelProto) -> int:
    """Bytes of the model's initializers' values (raw data, or the typed fields' values)."""
    total = 0
    for tensor in model.graph.initializer:
        total += len(tensor.raw_data) if tensor.raw_data else onnx.numpy_helper.to_array(tensor).nbytes
    return total


def _written(qgraph: QGraph, opset: int | None, isa: str, nodes: bool = True) -> tuple[QdqWriter, str, int | None]:
    """The QGraph's layers written (see `to_qdq_onnx`), the instruction set resolved and the opset to convert to
    (None: the exporter's own); BuildError naming layers it cannot write. Without `nodes`, the writer makes no
    NodeProtos unless the model is to be converted (sizing the initializers needs none)."""
    blocked = [layer.name for layer in qgraph.layers if isinstance(layer, QBlockedDense)]
    if opset is None and (narrow_weights(qgraph) or blocked):
        opset = INT4_OPSET
    if blocked and opset is not None and opset < BLOCKED_OPSET:
        raise BuildError(f"onnx export: layer {blocked[0]!r} (blocked_dense) has blocked weight scales, which "
                         f"DequantizeLinear reads from opset {BLOCKED_OPSET} on; nearest representable: "
                         f"options.opset {BLOCKED_OPSET}")
    sixteen = [layer.name for layer in qgraph.layers
               if any(name in qgraph.tensors and qgraph.tensors[name].params.dtype == "int16"
                      for name in (*layer.inputs, *layer.outputs))]
    if sixteen and opset is not None and opset < INT16_OPSET:
        raise BuildError(f"onnx export: layer {sixteen[0]!r} has int16 activations, which QuantizeLinear and "
                         f"DequantizeLinear take from opset {INT16_OPSET} on; nearest representable: "
                         f"options.opset {INT16_OPSET}")
    if sixteen and opset is None:
        opset = INT16_OPSET
    qgraph.require_dtypes("onnx", activations=[name for name in ONNX_TYPES if name != "int32"])
    missing = [f"{layer.name!r} ({layer.op})" for layer in qgraph.layers if layer.op not in WRITERS]
    if missing:
        raise BuildError(f"onnx export: no QDQ writer for layer {', '.join(missing)}")
    isa = resolve(isa)
    writer = QdqWriter(qgraph, saturates(isa), nodes or (opset or OPSET) != OPSET)
    if qgraph.takes_indices:  # token ids: read as they come, by the embeddings' Gathers
        writer.integers[qgraph.input] = writer.real[qgraph.input] = qgraph.input
    else:
        writer.quantize(qgraph.input, qgraph.input, writer.emitter.fresh(f"{qgraph.input}/real"))
    for layer in qgraph.layers:
        WRITERS[layer.op](writer, layer)
        writer.finish_layer()
    return writer, isa, opset


def stored_bytes(qgraph: QGraph, opset: int | None = None, isa: str = "auto") -> int:
    """`initializer_bytes` of the model `to_qdq_onnx` writes, without making it where the written opset is the
    exporter's own (no conversion, no INT4 packing: the initializers are the arrays written, byte for byte);
    tuning prices every config it compares, and a ResNet-50's protos took most of the export."""
    writer, isa, opset = _written(qgraph, opset, isa, nodes=False)
    if not writer.emitter.make_nodes:
        return sum(values.nbytes for _, values in writer.emitter.arrays)
    return initializer_bytes(_model(qgraph, writer, isa, opset, "dabuild"))


def to_qdq_onnx(qgraph: QGraph, opset: int | None = None, name: str = "dabuild",
                check: bool = True, isa: str = "auto") -> onnx.ModelProto:
    """The QGraph as a checked QDQ model with a dynamic batch; BuildError naming layers it cannot write.

    QuantizeLinear saturates to its zero point's full type, so activations must be exactly int8 or uint8, or
    int16 (TFLite's 16x8), which Q/DQ take from opset 21 on (the default then; a lower opset asked is refused);
    weights of up to 8 bits are exact in int8. Weights of 4 bits
    or fewer are INT4 initializers at opset 21 (the default opset then); at an opset asked below 21 they stay
    in int8. Blocked weights (blocked_dense) need opset 21 (the default then; a lower one asked is refused).
    `check=False` skips onnx's checker (for sizing a model nobody runs). `isa`: the instruction set the model
    will run on (`auto`: this machine's); where onnxruntime's u8s8 kernels saturate, wide weights are uint8."""
    writer, isa, opset = _written(qgraph, opset, isa)
    model = _model(qgraph, writer, isa, opset, name)
    if check:
        onnx.checker.check_model(model, full_check=True)
    return model


def _model(qgraph: QGraph, writer: QdqWriter, isa: str, opset: int | None, name: str) -> onnx.ModelProto:
    """The written model at `opset` (None: the exporter's own), its narrow weights packed where it takes INT4."""
    tensors = qgraph.tensors
    graph = helper.make_graph(
        writer.emitter.nodes, name,
        inputs=[value_info(qgraph.input, (None, *tensors[qgraph.input].shape),
                           "int64" if qgraph.takes_indices else "float32")],
        outputs=[value_info(qgraph.output, (None, *tensors[qgraph.output].shape))],
        initializer=writer.emitter.initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="dabuild",
                              producer_version=dabuild.__version__)
    model.ir_version = IR_VERSION
    activations = {tensor: writer.integers[tensor] for tensor in tensors
                   if tensor not in qgraph.constants and tensors[tensor].params != INDICES}
    helper.set_model_props(model, {QUANTIZED_TENSORS: json.dumps(activations, sort_keys=True), ISA: isa,
                                   UINT8_WEIGHTS: json.dumps(writer.uint8_weights)})
    if opset is not None and opset != OPSET:
        try:
            model = version_converter.convert_version(model, opset)
        except Exception as error:  # the converter raises bare RuntimeErrors for ops it cannot adapt
            raise BuildError(f"onnx export: converting the model from opset {OPSET} to {opset} failed: "
                             f"{error}") from error
        model.ir_version = helper.find_min_ir_version_for(list(model.opset_import))
    if (opset or OPSET) >= INT4_OPSET:
        _pack_int4(model, writer.weights)
    return model


def quantized_tensors(model: onnx.ModelProto) -> dict[str, str]:
    """QGraph tensor -> the model's name of its integers, as `to_qdq_onnx` recorded it."""
    props = {prop.key: prop.value for prop in model.metadata_props}
    return json.loads(props[QUANTIZED_TENSORS])
