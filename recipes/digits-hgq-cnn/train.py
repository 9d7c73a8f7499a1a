"""Train the HGQ2 CNN of this recipe on sklearn's 8x8 digits; write data.npz and model.keras.

The digits (shipped with scikit-learn, so offline) are split 75/25 with a fixed
seed and scaled to [0, 1], as (N, 8, 8, 1) images: Keras is channels last.
The network is quantization-aware (hgq2): every quantizer is one fixed-point
type per tensor that saturates and rounds half to even, the form dabuild's
given quantization states exactly (HGQ2's defaults, per-element widths that
wrap and round half up, are not). Keras runs on its torch backend.

    python recipes/digits-hgq-cnn/train.py
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras
import numpy as np
from hgq.config import QuantizerConfigScope
from hgq.layers import QConv2D, QDense, QMaxPool2D
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

HERE = Path(__file__).resolve().parent
SEED = 2024


def quantizers() -> QuantizerConfigScope:
    """One type per tensor, saturating, rounding half to even, for activations and weights alike."""
    return QuantizerConfigScope(place="all", overflow_mode="SAT", round_mode="RND_CONV", heterogeneous_axis=(),
                                homogeneous_axis=None)


def build() -> keras.Model:
    """conv 3x3 (8, relu) -> max pool 2 -> dense 10 logits; the Input is named `x`, as the recipe's model.inputs."""
    with quantizers():
        image = keras.Input((8, 8, 1), name="x")
        h = QConv2D(8, 3, activation="relu")(image)
        h = QMaxPool2D(2)(h)
        h = keras.layers.Flatten()(h)
        logits = QDense(10)(h)
    return keras.Model(image, logits, name="digits_hgq_cnn")


def digits() -> dict[str, np.ndarray]:
    data = load_digits()
    x = (data.images / 16.0).astype(np.float32)[..., None]
    x_train, x_test, y_train, y_test = train_test_split(x, data.target, test_size=0.25, random_state=SEED,
                                                        stratify=data.target)
    return {"x_train": x_train, "y_train": y_train.astype(np.int64), "x_test": x_test, "y_test": y_test.astype(np.int64)}


def main() -> None:
    keras.utils.set_random_seed(SEED)
    data = digits()
    model = build()
    model.compile(optimizer=keras.optimizers.Adam(3e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    model.fit(data["x_train"], data["y_train"], epochs=40, batch_size=64, verbose=0)
    _, accuracy = model.evaluate(data["x_test"], data["y_test"], verbose=0)
    print(f"test accuracy (HGQ2, quantized): {accuracy:.4f}")
    np.savez_compressed(HERE / "data.npz", **data)
    model.save(HERE / "model.keras")


if __name__ == "__main__":
    main()
