"""Run an .onnx model with onnxruntime's CPU provider, in process or from the command line.

The onnx target's `run` and `trace` call `run_session` on a `session` each keeps; a debug bundle's run.sh
calls `python -m dabuild.targets.onnx.runner model.onnx inputs.bin outputs.bin`
on the raw float32 files of the check, so both run the model the same way.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

PRECISION_MODE = "session.x64quantprecision"  # onnxruntime's: int8 weights as uint8, run in its exact u8u8 kernels
# onnxruntime fuses an opset-21 DequantizeLinear of a weight and its MatMul into MatMulNBits, which at its default
# accuracy level (4) quantizes the float input to int8 again, dynamically: a 16-bit activation loses up to 138 of
# its steps there. Level 1 computes the fused node in float32, as the QDQ model states it.
MATMUL_NBITS_ACCURACY = "session.qdq_matmulnbits_accuracy_level"


def session(model: str | bytes, threads: int = 1, precise: bool = False) -> ort.InferenceSession:
    """A CPU session with `threads` intra-op threads (the latency a single-core deployment sees at 1).

    Without onnxruntime's CPU memory arena: the arena keeps the largest batch's buffers for the session's life
    and, across sessions, fragments the heap (a ResNet-50 checked 32 samples a call grew past 2 GB); plain
    allocations go back to malloc as each tensor dies, for the same values (the arena changes no arithmetic).

    `precise`: onnxruntime's x64 precision mode, which computes as a CPU with VNNI does where this one's u8s8
    kernels would saturate (`dabuild.targets.onnx.isa`).
    """
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.enable_cpu_mem_arena = False
    options.add_session_config_entry(MATMUL_NBITS_ACCURACY, "1")
    if precise:
        options.add_session_config_entry(PRECISION_MODE, "1")
        model = explicit_zero_points(model)
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def explicit_zero_points(model: str | bytes) -> bytes:
    """The model with a zero point of int8 zeros on every per-axis DequantizeLinear of an int8 weight that has
    none (the same arithmetic: 0 is the default). onnxruntime's precision mode, rewriting such a weight to uint8,
    gives it a zero point of the wrong shape otherwise and fails."""
    loaded = onnx.load(model) if isinstance(model, str) else onnx.load_from_string(model)
    constants = {tensor.name: tensor for tensor in loaded.graph.initializer}
    for node in loaded.graph.node:
        if node.op_type != "DequantizeLinear" or len(node.input) != 2:
            continue
        weight, scale = constants.get(node.input[0]), constants.get(node.input[1])
        if weight is None or scale is None or weight.data_type != onnx.TensorProto.INT8 or len(scale.dims) != 1:
            continue
        zero_point = f"{node.input[0]}/zero_point"
        while zero_point in constants:
            zero_point += "_"
        constants[zero_point] = weight
        loaded.graph.initializer.append(onnx.numpy_helper.from_array(np.zeros(scale.dims, np.int8), zero_point))
        node.input.append(zero_point)
    return loaded.SerializeToString()


def run_session(runner: ort.InferenceSession, inputs: np.ndarray,
                outputs: list[str] | None = None) -> list[np.ndarray]:
    """The session's outputs (or the named tensors `outputs`) on a batch fed to its only input, in that
    input's dtype (float32, or int64 token ids)."""
    feed = {runner.get_inputs()[0].name: np.ascontiguousarray(inputs, dtype=input_dtype(runner))}
    return runner.run(outputs, feed)


def input_dtype(runner: Any) -> np.dtype:
    """float32, or int64 for a model whose input is integer indices (token ids)."""
    return np.dtype(np.int64 if runner.get_inputs()[0].type == "tensor(int64)" else np.float32)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run an ONNX model on a raw float32 batch; write raw float32 outputs.")
    parser.add_argument("model")
    parser.add_argument("inputs", help="raw float32 (int64 for token ids) values, C order, whole samples")
    parser.add_argument("outputs")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--precise", action="store_true", help="onnxruntime's x64 precision mode (no u8s8 saturation)")
    args = parser.parse_args(argv)
    runner = session(args.model, args.threads, args.precise)
    sample_shape = [int(d) for d in runner.get_inputs()[0].shape[1:]]
    x = np.fromfile(args.inputs, dtype=input_dtype(runner)).reshape(-1, *sample_shape)
    y = runner.run(None, {runner.get_inputs()[0].name: x})[0]
    np.ascontiguousarray(y, dtype=np.float32).tofile(args.outputs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
