"""Fixtures of the quantization tests: the digits MLP, traced, with its data."""

from __future__ import annotations

import numpy as np
import pytest
from support import DIGITS

from dabuild.ir.graph import Graph


@pytest.fixture(scope="module")
def digits_graph() -> tuple[Graph, dict[str, np.ndarray]]:
    """The digits example's float graph and its data arrays."""
    from dabuild.ir.passes import optimize
    from dabuild.trace.base import load_model, trace_model

    model = load_model(f"{DIGITS / 'model.py'}:build", DIGITS / "weights.npz")
    graph = optimize(trace_model(model, "numpy", {"x": (None, 64)}))
    with np.load(DIGITS / "data.npz") as data:
        return graph, {key: data[key] for key in data.files}
