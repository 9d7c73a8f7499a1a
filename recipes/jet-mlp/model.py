"""A jet-tagging-sized classifier as a plain numpy function: 16 features -> 64 -> 32 -> 32 -> 5 logits.

The shape of hls4ml's jet-tagging benchmark MLP; dabuild traces `build(weights)`'s
return value with its numpy frontend.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

LAYERS = 4


def build(weights: Mapping[str, np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
    """The forward function closed over weights.npz (w<i> of shape (in, out), b<i>)."""
    params = [(weights[f"w{i}"], weights[f"b{i}"]) for i in range(1, LAYERS + 1)]

    def forward(x: np.ndarray) -> np.ndarray:
        h = x
        for w, b in params[:-1]:
            h = np.maximum(h @ w + b, 0)
        w, b = params[-1]
        return h @ w + b

    return forward
