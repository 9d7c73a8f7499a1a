"""Regenerate data.npz, state.pt and model.onnx of the digits-cnn example.

    python recipes/digits-cnn/train.py

data.npz is ../digits/data.npz (the same 75/25 split) with the images shaped
(N, 1, 8, 8) for the convolutions. The CNN of model.py is trained with Adam
on one CPU thread with deterministic algorithms and a fixed seed, so a rerun
gives the same weights (a few seconds). model.onnx is the same network for
onnxruntime (opset 17, dynamic batch), which bench/tuning.py quantizes as the
peer to compare with.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from model import build
from torch import nn

from dabuild.ir.npz import read_npz, write_npz

HERE = Path(__file__).resolve().parent
SEED = 0
EPOCHS = 40
BATCH = 32
LEARNING_RATE = 2e-3


def image_split() -> dict[str, np.ndarray]:
    """The digits example's split with x reshaped to (N, 1, 8, 8)."""
    arrays = read_npz(HERE.parent / "digits" / "data.npz")
    return {key: value.reshape(-1, 1, 8, 8) if key.startswith("x_") else value for key, value in arrays.items()}


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    generator = torch.Generator().manual_seed(SEED)
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, EPOCHS)
    loss = nn.CrossEntropyLoss()
    model.train()
    for _ in range(EPOCHS):
        order = torch.randperm(len(x), generator=generator)
        for start in range(0, len(x), BATCH):
            batch = order[start:start + BATCH]
            optimizer.zero_grad()
            loss(model(x[batch]), y[batch]).backward()
            optimizer.step()
        schedule.step()
    model.eval()


def accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    with torch.no_grad():
        return float((model(torch.from_numpy(x)).argmax(1).numpy() == y).mean())


def main() -> None:
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    data = image_split()
    write_npz(HERE / "data.npz", data, compress=True)
    model = build()
    train(model, torch.from_numpy(data["x_train"]), torch.from_numpy(data["y_train"]))
    torch.save(model.state_dict(), HERE / "state.pt")
    torch.onnx.export(model, (torch.from_numpy(data["x_test"][:1]),), HERE / "model.onnx", dynamo=False,
                      opset_version=17, input_names=["x"], output_names=["logits"],
                      dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}})
    print(f"train accuracy {accuracy(model, data['x_train'], data['y_train']):.4f}, "
          f"test accuracy {accuracy(model, data['x_test'], data['y_test']):.4f}")


if __name__ == "__main__":
    main()
