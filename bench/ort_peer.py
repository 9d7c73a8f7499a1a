"""onnxruntime as a peer in the benchmarks: one calibration data reader, one opset-21 upgrade (where
QuantizeLinear/DequantizeLinear take int4), one accuracy measurement, so every bench feeds quantize_static and
scores its output the same way.

onnxruntime is imported inside the functions: bench/hard_cases.py re-runs itself in NNCF's venv, which
imports this module too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def calibration_reader(samples: np.ndarray, batch_size: int, input_name: str = "x"):
    """A fresh onnxruntime CalibrationDataReader over `samples` in batches of `batch_size` (quantize_static
    reads a reader once: make one per call)."""
    from onnxruntime.quantization import CalibrationDataReader

    class Samples(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter([{input_name: samples[i:i + batch_size]}
                                 for i in range(0, len(samples), batch_size)])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.batches, None)

    return Samples()


def upgrade_to_opset21(source: Path, output: Path) -> Path:
    """`source` converted to opset 21 (IR 10) and saved at `output`: quantize_static's QInt4 weights need it."""
    import onnx
    from onnx import version_converter

    upgraded = version_converter.convert_version(onnx.load(source), 21)
    upgraded.ir_version = 10
    onnx.save(upgraded, output)
    return output


def ort_accuracy(model: Path | bytes, x: np.ndarray, labels: np.ndarray, batch_size: int = 250) -> float:
    """Top-1 accuracy of the ONNX `model` (a file or its bytes) in onnxruntime's CPU provider at its default
    optimization level, run in batches of `batch_size`."""
    import onnxruntime

    session = onnxruntime.InferenceSession(model if isinstance(model, bytes) else str(model),
                                           providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    outputs = np.concatenate([session.run(None, {name: x[i:i + batch_size]})[0]
                              for i in range(0, len(x), batch_size)])
    return float((outputs.argmax(axis=1) == labels).mean())
