"""Train the HGQ2 jet-tagging MLP (16 -> 64 -> 32 -> 32 -> 5 logits) on ../jet-mlp/data.npz; write model.keras.

Quantization-aware with HGQ2's defaults: every activation quantizer has a
fixed-point type per element (k, i, f trained), rounds half up (RND) and
wraps (WRAP); kernels are per-element `kbi` types that round half up and
saturate symmetrically. The last layer's output quantizer (8 fractional bits)
bounds the logits. Keras runs on its torch backend; seeds are fixed.

    python recipes/jet-mlp-hgq/train.py
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras
import numpy as np
from hgq.layers import QDense

HERE = Path(__file__).resolve().parent
SIZES = [64, 32, 32]
CLASSES = 5


def build() -> keras.Model:
    """The untrained model; the Input is named `x`, as the recipe's model.inputs."""
    x = keras.Input((16,), name="x")
    h = x
    for size in SIZES:
        h = QDense(size, activation="relu")(h)
    logits = QDense(CLASSES, enable_oq=True, name="logits")(h)
    return keras.Model(x, logits, name="jet_mlp_hgq")


def main() -> None:
    keras.utils.set_random_seed(2024)
    data = np.load(HERE.parent / "jet-mlp" / "data.npz")
    model = build()
    model.compile(optimizer=keras.optimizers.Adam(3e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    model.fit(data["x_train"], data["y_train"], epochs=20, batch_size=128, verbose=0)
    _, accuracy = model.evaluate(data["x_test"], data["y_test"], verbose=0)
    print(f"test accuracy (HGQ2, quantized): {accuracy:.3f}")
    model.save(HERE / "model.keras")


if __name__ == "__main__":
    main()
