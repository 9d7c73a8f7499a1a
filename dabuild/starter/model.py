"""The starter model: a plain numpy function, 16 features -> 32 hidden (ReLU) -> 4 class scores.

dabuild traces what `build(weights)` returns with its numpy frontend; replace it
with your own model (numpy, torch or an .onnx file: see the README).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np


def build(weights: Mapping[str, np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
    """The forward function over the arrays of weights.npz."""
    w1, b1, w2, b2 = (weights[name] for name in ("w1", "b1", "w2", "b2"))

    def forward(x: np.ndarray) -> np.ndarray:
        return np.maximum(x @ w1 + b1, 0) @ w2 + b2

    return forward
