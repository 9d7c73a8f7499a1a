"""Makes data.npz for recipes/ds-cnn-tflite: seeded normal inputs (the law the converter calibrated on) and, as
labels, the classes the float file predicts in LiteRT, so accuracy is agreement with the float model.

    python recipes/ds-cnn-tflite/make_data.py      (needs dabuild[tflite])
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from ai_edge_litert.interpreter import Interpreter

HERE = Path(__file__).parent
FLOAT_MODEL = HERE.parent.parent / "tests" / "tflite_models" / "ds_cnn_float.tflite"


def classes(x: np.ndarray) -> np.ndarray:
    interpreter = Interpreter(model_path=str(FLOAT_MODEL))
    interpreter.allocate_tensors()
    [given], [taken] = interpreter.get_input_details(), interpreter.get_output_details()
    labels = []
    for sample in x:
        interpreter.set_tensor(given["index"], sample[None])
        interpreter.invoke()
        labels.append(int(np.argmax(interpreter.get_tensor(taken["index"]))))
    return np.array(labels, np.int64)


def main() -> None:
    rng = np.random.default_rng(7)
    x_train, x_test = (rng.normal(0, 1, (count, 25, 10, 1)).astype(np.float32) for count in (128, 128))
    np.savez(HERE / "data.npz", x_train=x_train, x_test=x_test, y_test=classes(x_test))


if __name__ == "__main__":
    main()
