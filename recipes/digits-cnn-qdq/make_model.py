"""Write model.onnx: recipes/digits-cnn's float model.onnx quantized by onnxruntime's `quantize_static`.

onnxruntime's defaults, as most QDQ files arrive: QDQ format, uint8
activations (asymmetric), int8 weights (symmetric, per tensor), calibrated
with MinMax on 64 training digits. onnxruntime's quantizer drops each Relu
after a quantized conv (the zero point does its work), so the file holds
QuantizeLinear/DequantizeLinear pairs around Conv, MaxPool,
GlobalAveragePool, Flatten and Gemm. `python make_model.py` rewrites model.onnx.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

HERE = Path(__file__).resolve().parent
SOURCE = HERE.parent / "digits-cnn"


class TrainingDigits(CalibrationDataReader):
    def __init__(self, x: np.ndarray, batch: int = 16):
        self.batches = iter([{"x": x[i:i + batch]} for i in range(0, len(x), batch)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.batches, None)


def make(path: Path, **options: object) -> None:
    """digits-cnn's model through quantize_static into `path`; `options` override its keywords (bench variants)."""
    x = np.load(SOURCE / "data.npz")["x_train"][:64].astype(np.float32)
    quantize_static(str(SOURCE / "model.onnx"), str(path), TrainingDigits(x),
                    **{"quant_format": QuantFormat.QDQ, **options})


if __name__ == "__main__":
    make(HERE / "model.onnx")
