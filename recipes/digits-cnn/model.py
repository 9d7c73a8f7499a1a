"""A small CNN for the 8x8 digits, as a torch module: 1x8x8 pixels -> 10 logits.

Three 3x3 convolutions with ReLU (8x8 -> 8x8 -> 6x6, max-pooled to 3x3 -> 3x3),
global average pooling and a dense head: about 14 k weights, almost all in the
two wider convolutions, which is where 4-bit weights pay off. dabuild calls
`build()` with no arguments and loads state.pt into it (recipe: `weights: state.pt`).
"""

from __future__ import annotations

from torch import nn


def build() -> nn.Module:
    """The untrained network; its parameter names are the keys of state.pt."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 32, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
    )
