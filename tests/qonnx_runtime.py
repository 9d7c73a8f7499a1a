"""qonnx's own executor on an original QONNX file, one sample at a time (QONNX files have a fixed batch of 1)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def run_qonnx(path: Path | str, x: np.ndarray) -> np.ndarray:
    """The model's first output for each row of `x`, computed by `qonnx.core.onnx_exec.execute_onnx`."""
    from qonnx.core.modelwrapper import ModelWrapper
    from qonnx.core.onnx_exec import execute_onnx
    from qonnx.transformation.infer_shapes import InferShapes

    model = ModelWrapper(str(path)).transform(InferShapes())
    name, output = model.graph.input[0].name, model.graph.output[0].name
    return np.concatenate([execute_onnx(model, {name: row[None]})[output] for row in x.astype(np.float32)])
