"""Run an .onnx model with onnxruntime's CPU provider, in process or from the command line.

The onnx target's `run` and `trace` call `run_session` on a `session` each keeps; a debug bundle's run.sh
calls `python -m dabuild.targets.onnx.runner model.onnx inputs.bin outputs.bin`
on the raw float32 files of the check, so both run the model the same way.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
import onnxruntime as ort


def session(model: str | bytes, threads: int = 1) -> ort.InferenceSession:
    """A CPU session with `threads` intra-op threads (the latency a single-core deployment sees at 1).

    Without onnxruntime's CPU memory arena: the arena keeps the largest batch's buffers for the session's life
    and, across sessions, fragments the heap (a ResNet-50 checked 32 samples a call grew past 2 GB); plain
    allocations go back to malloc as each tensor dies, for the same values (the arena changes no arithmetic).
    """
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.enable_cpu_mem_arena = False
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


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
    args = parser.parse_args(argv)
    runner = session(args.model, args.threads)
    sample_shape = [int(d) for d in runner.get_inputs()[0].shape[1:]]
    x = np.fromfile(args.inputs, dtype=input_dtype(runner)).reshape(-1, *sample_shape)
    y = runner.run(None, {runner.get_inputs()[0].name: x})[0]
    np.ascontiguousarray(y, dtype=np.float32).tofile(args.outputs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
