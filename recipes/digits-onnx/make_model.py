"""Write model.onnx: the digits MLP of ../digits (64 -> 32 -> 16 -> 10, ReLU) as an ONNX graph.

The layers are Gemm nodes with transB=1 and (out, in) weights, as PyTorch's
exporter writes nn.Linear, and the batch axis is the named dynamic dimension
"batch". Run from anywhere: `python recipes/digits-onnx/make_model.py`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent
WEIGHTS = HERE.parent / "digits" / "weights.npz"
OPSET = 17
IR_VERSION = 8  # what onnxruntime 1.17+ reads; onnx would otherwise stamp its newest


def build(weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    """Gemm(+Relu) per layer over the (in, out) weights of weights.npz, stored transposed."""
    initializers, nodes, current = [], [], "x"
    for layer in (1, 2, 3):
        w, b = weights[f"w{layer}"], weights[f"b{layer}"]
        initializers += [
            numpy_helper.from_array(np.ascontiguousarray(w.T, dtype=np.float32), f"fc{layer}.weight"),
            numpy_helper.from_array(b.astype(np.float32), f"fc{layer}.bias"),
        ]
        output = "logits" if layer == 3 else f"fc{layer}"
        nodes.append(
            helper.make_node(
                "Gemm", [current, f"fc{layer}.weight", f"fc{layer}.bias"], [output], name=f"fc{layer}", transB=1
            )
        )
        if layer < 3:
            nodes.append(helper.make_node("Relu", [output], [f"relu{layer}"], name=f"relu{layer}"))
            output = f"relu{layer}"
        current = output
    graph = helper.make_graph(
        nodes,
        "digits_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        initializers,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_operatorsetid("", OPSET)], ir_version=IR_VERSION, producer_name="dabuild"
    )
    onnx.checker.check_model(model)
    return model


def main() -> None:
    with np.load(WEIGHTS) as archive:
        weights = {name: archive[name] for name in archive.files}
    onnx.save(build(weights), HERE / "model.onnx")


if __name__ == "__main__":
    main()
