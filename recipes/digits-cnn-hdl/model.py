"""A tiny CNN for the 8x8 digits, sized for FPGA logic: 1x8x8 pixels -> 10 logits.

Two 3x3 convolutions with ReLU (8x8 -> 6x6, max-pooled to 3x3 -> 1x1) and a
dense head: under 700 weights. da4ml builds one adder graph per output
position of a convolution, so the first layer is narrow (4 channels over 36
positions) and the second wider but at one position. dabuild calls `build()`
with no arguments and loads state.pt into it (recipe: `weights: state.pt`).
"""

from __future__ import annotations

from torch import nn


def build() -> nn.Module:
    """The untrained network; its parameter names are the keys of state.pt."""
    return nn.Sequential(
        nn.Conv2d(1, 4, 3),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(4, 16, 3),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(16, 10),
    )
