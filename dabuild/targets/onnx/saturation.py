"""Which layers of a quantized ONNX model onnxruntime's u8s8 kernels can saturate, and its run without that.

A model dabuild did not write (a QDQ or QOperator file from onnxruntime's quantize_static, say) may hold int8
weights that saturate onnxruntime's u8s8 kernels on a CPU without VNNI (`isa`): there the file's own outputs
differ from what its arithmetic says, by tens of output steps, and dabuild's reference (the arithmetic) must
not be blamed for it. `run_original` runs the file as a user's default session does and, where this CPU
saturates, also with onnxruntime's own x64 precision mode (`session.x64quantprecision`: int8 weights are
rewritten as uint8 and run in the widening u8u8 kernels), and names the layers whose weights meet the
saturation condition (`saturating_nodes`).

The condition: onnxruntime (MLAS, `pmaddubsw`) adds the products of two neighbouring inputs of one output
channel into a saturating int16; activations reach it as uint8 (int8 ones shifted by 128), up to 255. An
output channel can saturate where its two largest positive weights sum beyond 32767 / 255 (128.5), or its two
most negative below -32768 / 255. Depthwise convs run in onnxruntime's own widening kernel and never do; uint8
weights run in u8u8 and never do.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from dabuild.targets.onnx.isa import detect, saturates
from dabuild.targets.onnx.runner import session

INT16 = (-(2**15), 2**15 - 1)
ACTIVATION_MAX = 255  # what an activation is when it reaches the kernel: uint8
# op -> the input holding its weight (QOperator ops take it as an integer, QDQ ones through a DequantizeLinear)
QOPERATOR_WEIGHTS = {"QLinearConv": 3, "ConvInteger": 1, "QLinearMatMul": 3, "MatMulInteger": 1, "QGemm": 3}
QDQ_WEIGHTS = {"Conv": 1, "ConvTranspose": 1, "MatMul": 1, "Gemm": 1}


def _output_axis(node: onnx.NodeProto) -> int:
    """Axis of the weight that indexes output channels (the rest are summed)."""
    if node.op_type in ("Conv", "QLinearConv", "ConvInteger"):
        return 0
    if node.op_type == "ConvTranspose":
        return 1
    if node.op_type in ("Gemm", "QGemm"):
        transposed = next((attr.i for attr in node.attribute if attr.name == "transB"), 0)
        return 0 if transposed else 1
    return 1  # MatMul: (K, N)


def _depthwise(node: onnx.NodeProto, weight: np.ndarray) -> bool:
    group = next((attr.i for attr in node.attribute if attr.name == "group"), 1)
    return node.op_type in ("Conv", "QLinearConv", "ConvInteger") and group > 1 and weight.shape[1] == 1


def pair_sums_overflow(weight: np.ndarray, axis: int, activation_max: int = ACTIVATION_MAX) -> bool:
    """Whether two inputs of one output channel, each up to `activation_max`, can drive a pair of products out of
    int16: the two largest positive weights (or two most negative) of a channel, times the activation's top."""
    channels = np.moveaxis(weight.astype(np.int64), axis, 0).reshape(weight.shape[axis], -1)
    if channels.shape[1] < 2:
        return False
    ordered = np.sort(channels, axis=1)
    positive = np.clip(ordered[:, -2:], 0, None).sum(axis=1) * activation_max
    negative = np.clip(ordered[:, :2], None, 0).sum(axis=1) * activation_max
    return bool(positive.max() > INT16[1] or negative.min() < INT16[0])


def saturating_nodes(model: onnx.ModelProto) -> list[str]:
    """The nodes (by name, or op and index) onnxruntime runs in a u8s8 kernel whose int8 weights meet the
    saturation condition: QOperator integer ops, and float Conv/MatMul/Gemm fed an int8 weight and an integer
    activation through DequantizeLinear (the pattern its QDQ optimizer fuses)."""
    graph = model.graph
    constants = {tensor.name: tensor for tensor in graph.initializer}
    producers = {output: node for node in graph.node for output in node.output}

    def int8_constant(name: str) -> np.ndarray | None:
        tensor = constants.get(name)
        return numpy_helper.to_array(tensor) if tensor is not None and tensor.data_type == TensorProto.INT8 else None

    def dequantized_int8(name: str) -> np.ndarray | None:
        producer = producers.get(name)
        return int8_constant(producer.input[0]) if producer and producer.op_type == "DequantizeLinear" else None

    def eight_bit_activation(name: str) -> bool:
        """Is `name` dequantized from 8-bit integers (the only activations the QDQ optimizer fuses)? A
        DequantizeLinear's zero point says its type; without one it is uint8."""
        producer = producers.get(name)
        if producer is None or producer.op_type != "DequantizeLinear":
            return False
        zero_point = constants.get(producer.input[2]) if len(producer.input) > 2 and producer.input[2] else None
        return zero_point is None or zero_point.data_type in (TensorProto.INT8, TensorProto.UINT8)

    found = []
    for index, node in enumerate(graph.node):
        if node.op_type in QOPERATOR_WEIGHTS and len(node.input) > QOPERATOR_WEIGHTS[node.op_type]:
            weight = int8_constant(node.input[QOPERATOR_WEIGHTS[node.op_type]])
        elif node.op_type in QDQ_WEIGHTS and len(node.input) > 1 and eight_bit_activation(node.input[0]):
            weight = dequantized_int8(node.input[QDQ_WEIGHTS[node.op_type]])
        else:
            continue
        if weight is None or weight.ndim < 2 or _depthwise(node, weight):
            continue
        if pair_sums_overflow(weight, _output_axis(node)):
            found.append(node.name or f"{node.op_type}#{index}")
    return found


@dataclass(frozen=True)
class OriginalRun:
    """A file run by onnxruntime on this CPU: what its default session returns, what its arithmetic gives
    without saturation (the same where nothing can saturate here), and the layers that can saturate here."""

    isa: str
    outputs: np.ndarray
    exact: np.ndarray
    saturated: list[str]
    unchecked: str | None = None  # why the precision mode could not run it (then `exact` is the default run)

    def describe(self) -> str:
        if not self.saturated:
            return f"onnxruntime runs it exactly on this CPU ({self.isa})"
        if self.unchecked:
            return (f"onnxruntime's u8s8 kernels can saturate on this CPU ({self.isa}, no VNNI) in layers "
                    f"{', '.join(map(repr, self.saturated))}, unchecked: its x64 precision mode {self.unchecked}")
        difference = float(np.abs(self.outputs.astype(np.float64) - self.exact).max())
        return (f"onnxruntime's u8s8 kernels can saturate on this CPU ({self.isa}, no VNNI) in layers "
                f"{', '.join(map(repr, self.saturated))} (pairs of int8 weights beyond +-128 times uint8 "
                f"activations leave int16): its default session's outputs differ from its x64 precision mode's "
                f"by up to {difference:g}")


def run_original(path: Path, inputs: np.ndarray) -> OriginalRun:
    """The ONNX file at `path` on float32 `inputs` (its only input), as `OriginalRun` says."""
    default = session(str(path))  # the runner's: one thread, no arena (which changes no arithmetic)
    name = default.get_inputs()[0].name
    outputs = default.run(None, {name: inputs.astype(np.float32)})[0]
    isa = detect()
    saturated = saturating_nodes(onnx.load(str(path))) if saturates(isa) else []
    if not saturated:
        return OriginalRun(isa, outputs, outputs, saturated)
    try:
        exact = session(str(path), precise=True).run(None, {name: inputs.astype(np.float32)})[0]
    except Exception as error:  # noqa: BLE001 - onnxruntime raises bare Exception subclasses (its precision mode lacks a QGemm kernel)
        return OriginalRun(isa, outputs, outputs, saturated, f"cannot run it: {str(error).splitlines()[0]}")
    return OriginalRun(isa, outputs, exact, saturated)
