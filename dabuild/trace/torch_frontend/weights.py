"""Build a torch model from a factory and a state-dict file, loaded with `weights_only=True`.

`weights_only=True` lets torch.load unpickle tensors and plain containers only,
so a weights file cannot run code. A state dict that does not fit the model
fails with every missing, unexpected and misshaped key at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from dabuild.errors import BuildError, UsageError
from dabuild.trace.torch_frontend.capture import first_line


def read_state_dict(path: Path) -> Mapping[str, torch.Tensor]:
    """The tensors of a state-dict file; UsageError naming the file if it is anything else."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - pickle, zip and torch errors alike
        raise UsageError(f"{path}: not a state dict torch.load(weights_only=True) can read: {first_line(error)}") from None
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UsageError(f"{path}: holds a {type(state).__name__}, not a state dict (a mapping of names to tensors)")
    return state


def mismatches(module: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> list[str]:
    """Every way `state` does not fit `module`, one line each."""
    expected = module.state_dict()
    problems = [f"missing key {key}" for key in expected if key not in state]
    problems += [f"unexpected key {key}" for key in state if key not in expected]
    problems += [
        f"{key}: file has shape {list(state[key].shape)}, the model {list(value.shape)}"
        for key, value in expected.items()
        if key in state and state[key].shape != value.shape
    ]
    return problems


def build_with_state_dict(factory: Any, path: Path, where: str) -> torch.nn.Module:
    """`factory()` (or the module `factory` already is) with the state dict in `path` loaded."""
    state = read_state_dict(path)
    if isinstance(factory, torch.nn.Module):
        module = factory
    elif callable(factory):
        try:
            module = factory()
        except Exception as error:
            raise BuildError(f"{where}() raised {first_line(error)}") from error
    else:
        raise UsageError(f"{where} must be a torch.nn.Module or a factory returning one, got {type(factory).__name__}")
    if not isinstance(module, torch.nn.Module):
        raise UsageError(f"{where}() returned a {type(module).__name__}, not a torch.nn.Module")
    problems = mismatches(module, state)
    if problems:
        raise UsageError(f"{path}: state dict does not fit {where}: " + "; ".join(problems))
    module.load_state_dict(state, strict=True)
    return module
