"""stack_batch: a one-sample graph (batch fixed to 1, moved off axis 0) run over any batch, checked at load."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from dabuild.errors import BuildError
from dabuild.ir.graph import Graph, Node, TensorSpec
from dabuild.ir.interpreter import run
from dabuild.trace.stacked_batch import STACKED, stack_batch

RNG = np.random.default_rng(7)


def per_sample(graph: Graph, x: np.ndarray) -> np.ndarray:
    return np.concatenate([run(graph, {"x": x[i:i + 1]})["y"] for i in range(len(x))])


def test_a_conv_over_the_moved_axis_runs_on_the_samples_folded_together() -> None:
    """(1, 3, 5, 5) transposed to (3, 1, 5, 5): the conv takes the channels as its batch, per sample."""
    graph = Graph([TensorSpec("x", (1, 3, 5, 5))], ["y"], [
        Node("moved", "transpose", ["x"], ["t"], {"perm": [1, 0, 2, 3]}),
        Node("conv", "conv", ["t", "w"], ["c"], {"pads": [1, 1, 1, 1]}),
        Node("back", "reshape", ["c"], ["y"], {"shape": [1, 6, 5, 5]}),
    ], {"w": RNG.normal(size=(2, 1, 3, 3)).astype(np.float32)})
    relaxed = stack_batch(graph)
    assert relaxed.inputs[0].shape == (None, 3, 5, 5)
    x = RNG.normal(size=(4, 3, 5, 5)).astype(np.float32)
    np.testing.assert_allclose(run(relaxed, {"x": x})["y"], per_sample(graph, x), rtol=1e-5, atol=1e-6)


def test_layer_norm_and_softmax_over_stacked_tensors_shift_their_axes() -> None:
    graph = Graph([TensorSpec("x", (1, 4, 6))], ["y"], [
        Node("moved", "transpose", ["x"], ["t"], {"perm": [1, 0, 2]}),
        Node("norm", "layer_norm", ["t", "scale"], ["n"], {"axis": -1}),
        Node("soft", "softmax", ["n"], ["s"], {"axis": 0}),
        Node("back", "transpose", ["s"], ["y"], {"perm": [1, 0, 2]}),
    ], {"scale": RNG.uniform(0.5, 2, size=6).astype(np.float32)})
    relaxed = stack_batch(graph)
    x = RNG.normal(size=(3, 4, 6)).astype(np.float32)
    np.testing.assert_allclose(run(relaxed, {"x": x})["y"], per_sample(graph, x), rtol=1e-5, atol=1e-6)


def test_a_rule_that_computes_something_else_is_caught_by_the_check() -> None:
    def wrong(attrs: dict[str, Any], shapes: list[tuple[int, ...]]) -> dict[str, Any]:
        return {**attrs, "perm": [0, 1, 3, 2]}  # keeps the stacked shape's rank but moves the wrong axes

    graph = Graph([TensorSpec("x", (1, 4, 4))], ["y"], [
        Node("moved", "transpose", ["x"], ["t"], {"perm": [1, 0, 2]}),
        Node("act", "relu", ["t"], ["r"]),
        Node("flat", "reshape", ["r"], ["y"], {"shape": [1, 16]}),
    ], {})
    with STACKED.without("transpose"):
        STACKED.add("transpose", wrong)
        with pytest.raises(BuildError, match="differs from the one-sample graph|does not run on two samples"):
            stack_batch(graph)
    x = RNG.normal(size=(3, 4, 4)).astype(np.float32)
    np.testing.assert_array_equal(run(stack_batch(graph), {"x": x})["y"], per_sample(graph, x))


def test_an_output_without_the_batch_first_is_refused() -> None:
    graph = Graph([TensorSpec("x", (1, 4))], ["y"], [Node("flat", "reshape", ["x"], ["y"], {"shape": [4]})], {})
    with pytest.raises(BuildError, match="output 'y' has no batch axis first"):
        stack_batch(graph)


def test_a_per_sample_tensor_as_a_conv_weight_is_refused() -> None:
    """A weight that is a graph input (the onnx backend cases feed Conv's W so) has no batch to stack."""
    graph = Graph([TensorSpec("x", (1, 1, 5, 5)), TensorSpec("w", (1, 1, 3, 3))], ["y"],
                  [Node("conv", "conv", ["x", "w"], ["y"], {})], {})
    with pytest.raises(BuildError, match=r"node 'conv' \(conv\) takes a per-sample tensor as a parameter"):
        stack_batch(graph)
