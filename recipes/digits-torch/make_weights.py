"""Write state.pt, the torch state dict of the digits MLP, from the numpy example's trained weights.

    python recipes/digits-torch/make_weights.py

../digits/weights.npz holds w1..w3 as (in, out) matrices for `x @ w + b`;
nn.Linear keeps its weight as (out, in), so each matrix is transposed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from model import build

HERE = Path(__file__).resolve().parent
LINEAR_LAYERS = (0, 2, 4)  # positions of the nn.Linear layers in build()'s nn.Sequential


def state_dict(arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    state = {}
    for number, position in enumerate(LINEAR_LAYERS, start=1):
        state[f"{position}.weight"] = torch.from_numpy(np.ascontiguousarray(arrays[f"w{number}"].T))
        state[f"{position}.bias"] = torch.from_numpy(arrays[f"b{number}"])
    return state


def main() -> None:
    with np.load(HERE.parent / "digits" / "weights.npz") as weights:
        state = state_dict(dict(weights))
    build().load_state_dict(state, strict=True)  # the keys and shapes fit the model
    torch.save(state, HERE / "state.pt")


if __name__ == "__main__":
    main()
