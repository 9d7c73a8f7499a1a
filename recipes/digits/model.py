"""The digits classifier as a plain numpy function: 64 pixels -> 32 -> 16 -> 10 logits.

dabuild traces `build(weights)`'s return value with its numpy frontend; the
function is ordinary numpy, so it also runs as-is for a reference answer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np


def build(weights: Mapping[str, np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
    """The forward function closed over the arrays of weights.npz (w of shape (in, out))."""
    w1, b1, w2, b2, w3, b3 = (weights[name] for name in ("w1", "b1", "w2", "b2", "w3", "b3"))

    def forward(x: np.ndarray) -> np.ndarray:
        h = np.maximum(x @ w1 + b1, 0)
        h = np.maximum(h @ w2 + b2, 0)
        return h @ w3 + b3

    return forward
