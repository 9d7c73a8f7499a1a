"""Write model.onnx: recipes/digits' 64-32-16-10 MLP as a Brevitas-style QONNX file with power-of-two scales.

The layout Brevitas's `export_qonnx` gives a QuantLinear/QuantReLU network
with fixed-point quantizers (Int8WeightPerTensorFixedPoint-like weights, per
output channel here, and Uint8ActPerTensorFixedPoint activations): the input
through a `Quant` (uint8), each layer a `Gemm` (transB) whose weight comes
through a `Quant` (signed, narrow), a float bias, `Relu`, then a `Quant`
(unsigned) of the activation; the logits through a signed `Quant`. Every
scale is a power of two, so the file maps straight onto the hdl target.

The weights are recipes/digits' float ones, quantized once here (6-bit
weights, 8-bit activations, scales the least powers of two covering the
weights and the calibration activations): the quantization a
quantization-aware training would hand over. `python make_model.py` rewrites
model.onnx; tests build variants with `qonnx_mlp`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent
DOMAIN = "qonnx.custom_op.general"


def pot_at_least(values: np.ndarray) -> np.ndarray:
    return 2.0 ** np.ceil(np.log2(np.maximum(values, 1e-12)))


def qonnx_mlp(weights: list[np.ndarray], biases: list[np.ndarray], x: np.ndarray, weight_bits: int = 6,
              activation_bits: int = 8, per_channel: bool = True, rounding: str = "ROUND") -> onnx.ModelProto:
    """A Brevitas-style QONNX MLP (relu between layers, batch 1 as Brevitas exports) with pot scales calibrated
    on `x`; biases on their accumulator's grid (input scale x weight scale, as Brevitas's integer bias
    quantizers leave them), every Quant rounding with `rounding` (Brevitas's default ROUND is half to even)."""
    initializers: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def constant(name: str, value: np.ndarray | float) -> str:
        initializers.append(numpy_helper.from_array(np.asarray(value, dtype=np.float32), name))
        return name

    def quant(source: str, output: str, scale: np.ndarray | float, bits: int, signed: bool, narrow: bool) -> None:
        name = output.replace("/", "_")
        nodes.append(helper.make_node(
            "Quant", [source, constant(f"{name}_scale", scale), constant(f"{name}_zero", 0.0),
                      constant(f"{name}_bits", float(bits))], [output], domain=DOMAIN,
            signed=int(signed), narrow=int(narrow), rounding_mode=rounding))

    activation = x.astype(np.float64)
    input_scale = float(pot_at_least(np.abs(activation).max() / (2**activation_bits - 1)))
    quant("x", "x_q", input_scale, activation_bits, False, False)
    source, source_scale = "x_q", input_scale
    activation = np.clip(np.round(activation / input_scale), 0, 2**activation_bits - 1) * input_scale
    qmax = 2 ** (weight_bits - 1) - 1
    for index, (weight, bias) in enumerate(zip(weights, biases), start=1):
        last = index == len(weights)
        peaks = np.abs(weight).max(axis=0) if per_channel else np.abs(weight).max(keepdims=True)
        weight_scale = pot_at_least(peaks / qmax)
        weight_t = weight.T.astype(np.float32)  # Gemm transB: (out, in), per output channel along axis 0
        quant(constant(f"fc{index}_weight", weight_t), f"fc{index}_weight_q",
              weight_scale.reshape(-1, 1) if per_channel else weight_scale[0], weight_bits, True, True)
        bias = np.round(bias / (source_scale * weight_scale)) * (source_scale * weight_scale)
        nodes.append(helper.make_node("Gemm", [source, f"fc{index}_weight_q", constant(f"fc{index}_bias", bias)],
                                      [f"fc{index}"], transB=1))
        quantized_weight = np.clip(np.round(weight / weight_scale), -qmax, qmax) * weight_scale
        activation = activation @ quantized_weight + bias
        if not last:
            nodes.append(helper.make_node("Relu", [f"fc{index}"], [f"relu{index}"]))
            activation = np.maximum(activation, 0)
        scale = float(pot_at_least(np.abs(activation).max() / (2 ** (activation_bits - int(last)) - 1)))
        output = "y" if last else f"act{index}"
        quant(f"fc{index}" if last else f"relu{index}", output, scale, activation_bits, last, False)
        limit = 2 ** (activation_bits - 1) if last else 2**activation_bits - 1
        activation = np.clip(np.round(activation / scale), -limit if last else 0, limit - int(last)) * scale
        source, source_scale = output, scale
    graph = helper.make_graph(nodes, "brevitas_style_mlp",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, weights[0].shape[0]])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, weights[-1].shape[1]])],
                              initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid(DOMAIN, 1)],
                             producer_name="dabuild recipes/digits-qonnx (Brevitas-style)")


def main() -> None:
    trained = np.load(HERE.parent / "digits" / "weights.npz")
    data = np.load(HERE.parent / "digits" / "data.npz")
    model = qonnx_mlp([trained[f"w{i}"] for i in (1, 2, 3)], [trained[f"b{i}"] for i in (1, 2, 3)],
                      data["x_train"])
    onnx.save(model, HERE / "model.onnx")


if __name__ == "__main__":
    main()
