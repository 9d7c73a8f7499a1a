"""Regenerate weights.npz and data.npz of the digits example, bit for bit on one machine.

    python recipes/digits/train.py

Loads scikit-learn's 8x8 digits, scales pixels to [0, 1], splits 75/25
stratified with a fixed seed, and trains the MLP of model.py with Adam in plain
numpy (a few seconds). Both files are written with fixed zip timestamps, so a
rerun changes no bytes and no cache entry.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from model import build
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from dabuild.ir.npz import write_npz

HERE = Path(__file__).resolve().parent
SEED = 0
LAYERS = (64, 32, 16, 10)
EPOCHS = 60
BATCH = 32
LEARNING_RATE = 3e-3


def load_split() -> dict[str, np.ndarray]:
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.25, stratify=y, random_state=SEED
    )
    return {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test}


def init_weights(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """He-initialised weights (in, out) and zero biases, float32."""
    weights = {}
    for index, (fan_in, fan_out) in enumerate(zip(LAYERS, LAYERS[1:]), start=1):
        scale = np.sqrt(2.0 / fan_in)
        weights[f"w{index}"] = (rng.standard_normal((fan_in, fan_out)) * scale).astype(np.float32)
        weights[f"b{index}"] = np.zeros(fan_out, np.float32)
    return weights


def gradients(weights: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
    """Gradients of the mean softmax cross-entropy, by hand-written backpropagation."""
    activations = [x]
    for index in range(1, len(LAYERS)):
        z = activations[-1] @ weights[f"w{index}"] + weights[f"b{index}"]
        activations.append(np.maximum(z, 0) if index < len(LAYERS) - 1 else z)
    logits = activations[-1]
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    delta = probs
    delta[np.arange(len(y)), y] -= 1
    delta /= len(y)
    grads = {}
    for index in range(len(LAYERS) - 1, 0, -1):
        grads[f"w{index}"] = activations[index - 1].T @ delta
        grads[f"b{index}"] = delta.sum(axis=0)
        if index > 1:
            delta = (delta @ weights[f"w{index}"].T) * (activations[index - 1] > 0)
    return grads


def train(x: np.ndarray, y: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Adam on mini-batches in a seeded order."""
    weights = init_weights(rng)
    first = {k: np.zeros_like(v) for k, v in weights.items()}
    second = {k: np.zeros_like(v) for k, v in weights.items()}
    beta1, beta2, eps, step = 0.9, 0.999, 1e-8, 0
    for _ in range(EPOCHS):
        order = rng.permutation(len(x))
        for start in range(0, len(x), BATCH):
            batch = order[start : start + BATCH]
            step += 1
            for name, grad in gradients(weights, x[batch], y[batch]).items():
                first[name] = beta1 * first[name] + (1 - beta1) * grad
                second[name] = beta2 * second[name] + (1 - beta2) * grad * grad
                m_hat = first[name] / (1 - beta1**step)
                v_hat = second[name] / (1 - beta2**step)
                weights[name] = (weights[name] - LEARNING_RATE * m_hat / (np.sqrt(v_hat) + eps)).astype(np.float32)
    return weights


def main() -> None:
    data = load_split()
    weights = train(data["x_train"], data["y_train"], np.random.default_rng(SEED))
    forward = build(weights)
    accuracy = float(np.mean(forward(data["x_test"]).argmax(axis=1) == data["y_test"]))
    if accuracy < 0.95:
        raise SystemExit(f"test accuracy {accuracy:.4f} is below 0.95; not writing files")
    write_npz(HERE / "weights.npz", weights)
    write_npz(HERE / "data.npz", data, compress=True)
    print(f"test accuracy {accuracy:.4f}; wrote weights.npz and data.npz in {HERE}")


if __name__ == "__main__":
    main()
