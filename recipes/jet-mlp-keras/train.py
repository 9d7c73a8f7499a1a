"""Train the Keras jet-tagging MLP (16 -> 64 -> 32 -> 32 -> 5 logits) on ../jet-mlp/data.npz; write model.keras.

The data are recipes/jet-mlp's synthetic jets (regenerate them with that
folder's train.py). Keras runs on its torch backend; seeds are fixed.

    python recipes/jet-mlp-keras/train.py
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras
import numpy as np

HERE = Path(__file__).resolve().parent
SIZES = [64, 32, 32]
CLASSES = 5


def build() -> keras.Model:
    """The untrained model; the Input is named `x`, as the recipe's model.inputs."""
    layers = [keras.Input((16,), name="x")]
    layers += [keras.layers.Dense(size, activation="relu") for size in SIZES]
    layers.append(keras.layers.Dense(CLASSES, name="logits"))
    return keras.Sequential(layers, name="jet_mlp")


def main() -> None:
    keras.utils.set_random_seed(2024)
    data = np.load(HERE.parent / "jet-mlp" / "data.npz")
    model = build()
    model.compile(optimizer=keras.optimizers.Adam(3e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    model.fit(data["x_train"], data["y_train"], epochs=40, batch_size=128, verbose=0)
    _, accuracy = model.evaluate(data["x_test"], data["y_test"], verbose=0)
    print(f"test accuracy (float): {accuracy:.3f}")
    model.save(HERE / "model.keras")


if __name__ == "__main__":
    main()
