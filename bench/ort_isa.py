"""Which QDQ weight forms onnxruntime runs exactly on this CPU, and what each costs in time (the onnx target's `isa`).

One-layer QDQ models (conv 3x3 64->64 at 56x56, conv 1x1 256->64 at 56x56, MatMul 2048->1000; per-channel
weights; half the activations at their top and half the weights at their extremes, the worst case for the
int16 pair sums of u8s8 without VNNI), run by onnxruntime at its defaults, 1 thread, batch 1. Per form: the
most output steps from the exact integer result, and the fastest of 30 interleaved runs as a ratio to int8 weights with uint8
activations (u8s8, onnxruntime's usual form) measured in the same run. The forms: u8s8 with 8-bit weights;
the same with 7-bit weights (what the tuner offers first where u8s8 saturates); uint8 weights with zero
point 128 (what the exporter writes there for wider weights); int8 activations (s8s8).

Usage: python bench/ort_isa.py
"""

from __future__ import annotations

import platform
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from dabuild.targets.onnx.isa import detect, saturates

FORMS = {  # name -> (activation type, weight type, weight bits)
    "u8s8 8-bit": ("u8", "s8", 8), "u8s8 7-bit": ("u8", "s8", 7), "u8u8 (uint8 weights)": ("u8", "u8", 8),
    "s8s8 8-bit": ("s8", "s8", 8),
}
LAYERS = {"conv3x3 64->64 56x56": ("conv", 64, 64, 3, 56), "conv1x1 256->64 56x56": ("conv", 256, 64, 1, 56),
          "matmul 2048->1000": ("matmul", 2048, 1000, 0, 0)}
TYPES = {"u8": (np.uint8, 128), "s8": (np.int8, 0)}
SX, SY = 0.02, 8.0
ROUNDS = 30


def layer_model(layer: tuple, form: tuple, rng: np.random.Generator):
    """The QDQ model of one layer in one form, its integer weights and per-channel scales."""
    op, channels, outputs, kernel, size = layer
    activation, weight_type, bits = form
    limit = 2 ** (bits - 1) - 1
    shape = (outputs, channels, kernel, kernel) if op == "conv" else (channels, outputs)
    weight = rng.integers(-limit - 1, limit + 1, shape)
    weight = np.where(rng.random(shape) < 0.5, np.where(weight < 0, -limit - 1, limit), weight)
    weight_zero = 128 if weight_type == "u8" else 0
    scale = (rng.uniform(0.5, 1.5, outputs) * 0.01).astype(np.float32)
    adtype, azero = TYPES[activation]
    initializers = [numpy_helper.from_array(np.array(SX, np.float32), "sx"),
                    numpy_helper.from_array(np.array(azero, adtype), "zx"),
                    numpy_helper.from_array(np.array(SY, np.float32), "sy"),
                    numpy_helper.from_array((weight + weight_zero).astype(TYPES[weight_type][0]), "w"),
                    numpy_helper.from_array(scale, "sw"),
                    numpy_helper.from_array(np.full(outputs, weight_zero, TYPES[weight_type][0]), "zw")]
    product = (helper.make_node("Conv", ["xr", "wr"], ["yf"], pads=[kernel // 2] * 4) if op == "conv"
               else helper.make_node("MatMul", ["xr", "wr"], ["yf"]))
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xr"]),
             helper.make_node("DequantizeLinear", ["w", "sw", "zw"], ["wr"], axis=0 if op == "conv" else 1),
             product,
             helper.make_node("QuantizeLinear", ["yf", "sy", "zx"], ["yq"]),
             helper.make_node("DequantizeLinear", ["yq", "sy", "zx"], ["y"])]
    x_shape, y_shape = ([1, channels, size, size], [1, outputs, size, size]) if op == "conv" else ([1, channels], [1, outputs])
    graph = helper.make_graph(nodes, "layer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model, weight, scale, x_shape


def exact(layer: tuple, form: tuple, x: np.ndarray, weight: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """The layer's exact integer result, requantized and dequantized as the model's output."""
    op, *_ = layer
    dtype, zero = TYPES[form[0]]
    info = np.iinfo(dtype)
    q = np.clip(np.rint(x / SX) + zero, info.min, info.max) - zero
    if op == "conv":
        kernel = weight.shape[-1]
        pad = kernel // 2
        padded = np.pad(q, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
        size = x.shape[-1]
        windows = np.lib.stride_tricks.sliding_window_view(padded, (kernel, kernel), axis=(2, 3))[:, :, :size, :size]
        accumulator = np.einsum("nchwij,ocij->nohw", windows, weight.astype(np.float64))
        real = accumulator * SX * scale.reshape(-1, 1, 1) / SY
    else:
        real = q @ weight.astype(np.float64) * SX * scale / SY
    return (np.clip(np.rint(real) + zero, info.min, info.max) - zero) * SY


def main() -> None:
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []
    cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")),
               platform.processor() or platform.machine())
    isa = detect()
    print(f"CPU: {cpu}; isa {isa} (u8s8 {'saturates' if saturates(isa) else 'exact'}); onnxruntime {ort.__version__}")
    print(f"{'layer':24s} {'form':22s} {'max steps':>9s} {'ms':>8s} {'time vs u8s8 8-bit':>18s}")
    rng = np.random.default_rng(0)
    for layer_name, layer in LAYERS.items():
        runs = {}
        for form_name, form in FORMS.items():
            model, weight, scale, x_shape = layer_model(layer, form, rng)
            options = ort.SessionOptions()
            options.intra_op_num_threads = 1
            session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
            dtype, zero = TYPES[form[0]]
            top = (np.iinfo(dtype).max - zero) * SX
            x = np.where(rng.random(x_shape) < 0.5, top, rng.uniform(-top, top, x_shape)).astype(np.float32)
            expected = exact(layer, form, x.astype(np.float64), weight, scale)
            runs[form_name] = (session, x, float(np.abs(session.run(None, {"x": x})[0] - expected).max() / SY))
        fastest = dict.fromkeys(FORMS, np.inf)
        for _ in range(ROUNDS):  # forms interleaved, the fastest of each kept: a shared machine's noise only adds
            for form_name, (session, x, _steps) in runs.items():
                start = time.perf_counter()
                session.run(None, {"x": x})
                fastest[form_name] = min(fastest[form_name], time.perf_counter() - start)
        baseline = fastest["u8s8 8-bit"]
        for form_name, (_session, _x, steps) in runs.items():
            print(f"{layer_name:24s} {form_name:22s} {steps:9.0f} {fastest[form_name] * 1e3:8.3f} "
                  f"{fastest[form_name] / baseline:17.2f}x")
    print("goal: 0 or 1 step (float requantization) for every form the onnx target writes on this isa")


if __name__ == "__main__":
    main()
