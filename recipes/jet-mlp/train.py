"""Make data.npz (synthetic 5-class jets) and weights.npz (the MLP of model.py trained on them).

The data come from a known generator, so anyone can regenerate them: five
classes, each a Gaussian cloud in 16 features around its own centre, with a
shared random correlation and a nonlinear distortion (so a linear model does
not separate them). Training is plain numpy: full-batch Adam on softmax
cross-entropy, He initialisation, fixed seeds.

    python recipes/jet-mlp/train.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from model import LAYERS, build

HERE = Path(__file__).resolve().parent
SIZES = [16, 64, 32, 32, 5]
CLASSES, FEATURES = 5, 16


def make_data(samples: int, rng: np.random.Generator, centres: np.ndarray, mixing: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
    y = rng.integers(0, CLASSES, samples)
    z = rng.normal(size=(samples, FEATURES)) @ mixing + centres[y]
    x = np.tanh(z) + 0.1 * z  # a monotone distortion per feature
    return x.astype(np.float32), y.astype(np.int64)


def train(x: np.ndarray, y: np.ndarray, rng: np.random.Generator, steps: int = 1500, rate: float = 3e-3
          ) -> dict[str, np.ndarray]:
    params = {}
    for i, (n_in, n_out) in enumerate(zip(SIZES, SIZES[1:]), start=1):
        params[f"w{i}"] = rng.normal(0, np.sqrt(2 / n_in), (n_in, n_out))
        params[f"b{i}"] = np.zeros(n_out)
    moments = {k: (np.zeros_like(v), np.zeros_like(v)) for k, v in params.items()}
    onehot = np.eye(CLASSES)[y]
    for step in range(1, steps + 1):
        activations, h = [x.astype(np.float64)], x.astype(np.float64)
        for i in range(1, LAYERS + 1):
            h = h @ params[f"w{i}"] + params[f"b{i}"]
            if i < LAYERS:
                h = np.maximum(h, 0)
            activations.append(h)
        logits = activations[-1] - activations[-1].max(axis=1, keepdims=True)
        probabilities = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
        delta = (probabilities - onehot) / len(x)
        for i in range(LAYERS, 0, -1):
            grads = {f"w{i}": activations[i - 1].T @ delta, f"b{i}": delta.sum(axis=0)}
            delta = (delta @ params[f"w{i}"].T) * (activations[i - 1] > 0)
            for key, grad in grads.items():
                m, v = moments[key]
                m[:] = 0.9 * m + 0.1 * grad
                v[:] = 0.999 * v + 0.001 * grad**2
                params[key] -= rate * (m / (1 - 0.9**step)) / (np.sqrt(v / (1 - 0.999**step)) + 1e-8)
    return {k: v.astype(np.float32) for k, v in params.items()}


def main() -> None:
    rng = np.random.default_rng(2024)
    centres = rng.normal(0, 1.0, (CLASSES, FEATURES))
    mixing = rng.normal(0, 0.6, (FEATURES, FEATURES))
    x_train, y_train = make_data(4000, rng, centres, mixing)
    x_test, y_test = make_data(1000, rng, centres, mixing)
    weights = train(x_train, y_train, rng)
    accuracy = float((build(weights)(x_test).argmax(axis=1) == y_test).mean())
    print(f"test accuracy (float): {accuracy:.3f}")
    np.savez_compressed(HERE / "weights.npz", **weights)
    np.savez_compressed(HERE / "data.npz", x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)


if __name__ == "__main__":
    main()
