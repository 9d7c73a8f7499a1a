"""A tiny numpy model the corpus recipes point at; it is never imported by validation."""

import numpy as np


def build(weights):
    return lambda x: np.maximum(x @ weights["w"], 0)
