"""The digits classifier as a torch module: 64 pixels -> 32 -> 16 -> 10 logits.

The same network as ../digits/model.py, written the way a PyTorch user would.
dabuild calls `build()` with no arguments and loads state.pt into the module
with `torch.load(weights_only=True)` (recipe: `weights: state.pt`).
"""

from __future__ import annotations

from torch import nn


def build() -> nn.Module:
    """The untrained network; its parameter names are the keys of state.pt."""
    return nn.Sequential(
        nn.Linear(64, 32),
        nn.ReLU(),
        nn.Linear(32, 16),
        nn.ReLU(),
        nn.Linear(16, 10),
    )
