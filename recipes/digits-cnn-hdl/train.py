"""Regenerate data.npz and state.pt of the digits-cnn-hdl example.

    python recipes/digits-cnn-hdl/train.py

The data and the training are digits-cnn's (../digits-cnn/train.py: the
digits split as (N, 1, 8, 8) images, Adam with a fixed seed on one thread,
so a rerun gives the same weights); only the network (model.py) is smaller.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import torch
from model import build

from dabuild.ir.npz import write_npz

HERE = Path(__file__).resolve().parent


def digits_cnn_training() -> ModuleType:
    """../digits-cnn/train.py as a module (its `from model import build` finds this folder's model first)."""
    spec = importlib.util.spec_from_file_location("digits_cnn_train", HERE.parent / "digits-cnn" / "train.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    training = digits_cnn_training()
    torch.manual_seed(training.SEED)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    data = training.image_split()
    write_npz(HERE / "data.npz", data, compress=True)
    model = build()
    training.train(model, torch.from_numpy(data["x_train"]), torch.from_numpy(data["y_train"]))
    torch.save(model.state_dict(), HERE / "state.pt")
    print(f"train accuracy {training.accuracy(model, data['x_train'], data['y_train']):.4f}, "
          f"test accuracy {training.accuracy(model, data['x_test'], data['y_test']):.4f}")


if __name__ == "__main__":
    main()
