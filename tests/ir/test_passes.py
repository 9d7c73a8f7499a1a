"""Graph passes: each rewrite keeps what the graph computes and the names of its outputs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from dabuild.ir import Graph, Node, TensorSpec
from dabuild.ir.interpreter import run
from dabuild.ir.ops import OPS
from dabuild.ir.passes import (
    fold_batch_norm,
    fold_constants,
    fold_scale,
    fuse_activations,
    fuse_bias,
    optimize,
    remove_identities,
)

RNG = np.random.default_rng(11)


def normal(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


class Builder:
    """Appends nodes to a graph with one input x; each call returns the name of the tensor it writes."""

    def __init__(self, *shape: int | None):
        self.graph = Graph([TensorSpec("x", shape)], [], [], {})

    def const(self, array: np.ndarray) -> str:
        name = f"k{len(self.graph.constants)}"
        self.graph.constants[name] = array
        return name

    def __call__(self, op: str, *inputs: str, **attrs: Any) -> str:
        name = f"t{len(self.graph.nodes)}"
        self.graph.nodes.append(Node(f"n{len(self.graph.nodes)}", op, list(inputs), [name], attrs))
        return name

    def batch_norm(self, x: str, channels: int) -> str:
        params = [normal(channels), normal(channels), normal(channels), RNG.uniform(0.5, 2, channels).astype(np.float32)]
        return self("batch_norm", x, *map(self.const, params), epsilon=1e-3)

    def done(self, *outputs: str) -> Graph:
        self.graph.outputs = list(outputs)
        return self.graph


def assert_same_results(before: Graph, after: Graph, x: np.ndarray) -> None:
    assert after.outputs == before.outputs
    expected, actual = run(before, {"x": x}), run(after, {"x": x})
    for name in before.outputs:
        np.testing.assert_allclose(actual[name], expected[name], rtol=1e-5, atol=1e-5, err_msg=name)


def ops(graph: Graph) -> list[str]:
    return [node.op for node in graph.nodes]


@pytest.mark.parametrize("with_bias", [False, True])
def test_batch_norm_folds_into_conv(with_bias: bool) -> None:
    b = Builder(None, 3, 6, 6)
    inputs = [b.const(normal(4, 3, 3, 3))] + ([b.const(normal(4))] if with_bias else [])
    y = b.batch_norm(b("conv", "x", *inputs, pads=[1, 1, 1, 1]), 4)
    graph = b.done(y)
    folded = fold_batch_norm(graph)
    assert ops(folded) == ["conv"]
    assert folded.nodes[0].outputs == [y]
    assert_same_results(graph, folded, normal(2, 3, 6, 6))


def test_batch_norm_folds_into_2d_dense_only() -> None:
    b = Builder(None, 5)
    flat = b.batch_norm(b("dense", "x", b.const(normal(5, 4)), b.const(normal(4))), 4)
    graph = b.done(flat)
    assert ops(fold_batch_norm(graph)) == ["dense"]
    assert_same_results(graph, fold_batch_norm(graph), normal(3, 5))

    b = Builder(None, 4, 5)  # (N, 4, out): batch_norm's channel axis 1 is not the dense's feature axis
    graph = b.done(b.batch_norm(b("dense", "x", b.const(normal(5, 4))), 4))
    assert ops(fold_batch_norm(graph)) == ["dense", "batch_norm"]


def test_batch_norm_stays_when_the_conv_output_is_read_elsewhere() -> None:
    b = Builder(None, 2, 4, 4)
    weight = b.const(normal(2, 2, 1, 1))
    raw = b("conv", "x", weight)
    graph = b.done(b("add", b.batch_norm(raw, 2), raw))
    assert ops(fold_batch_norm(graph)) == ["conv", "batch_norm", "add"]


def test_shared_weight_is_not_changed_for_its_other_reader() -> None:
    b = Builder(None, 2, 4, 4)
    weight = b.const(normal(2, 2, 1, 1))
    first = b.batch_norm(b("conv", "x", weight), 2)
    second = b("conv", "x", weight)
    graph = b.done(first, second)
    folded = fold_batch_norm(graph)
    assert ops(folded) == ["conv", "conv"]
    np.testing.assert_array_equal(folded.constants[weight], graph.constants[weight])
    assert_same_results(graph, folded, normal(2, 2, 4, 4))


@pytest.mark.parametrize(
    ("bias_shape", "spelling", "fused"),
    [
        ((1, 4, 1, 1), "y + c", True),
        ((4, 1, 1), "c + y", True),
        ((4, 1, 1), "y - c", True),
        ((1,), "y + c", True),  # one value for every channel
        ((4, 1, 1), "c - y", False),
        ((1, 1, 5, 5), "y + c", False),  # varies over space, not per channel
        ((1, 1, 4, 1, 1), "y + c", False),  # would raise the rank
    ],
)
def test_bias_fuses_into_conv_when_it_is_per_channel(bias_shape: tuple[int, ...], spelling: str, fused: bool) -> None:
    b = Builder(None, 3, 5, 5)
    y = b("conv", "x", b.const(normal(4, 3, 1, 1)), b.const(normal(4)))
    c = b.const(normal(*bias_shape))
    op, operands = {"y + c": ("add", (y, c)), "c + y": ("add", (c, y)), "y - c": ("sub", (y, c)),
                    "c - y": ("sub", (c, y))}[spelling]
    graph = b.done(b(op, *operands))
    result = fuse_bias(graph)
    assert ops(result) == (["conv"] if fused else ["conv", op])
    assert_same_results(graph, result, normal(2, 3, 5, 5))


@pytest.mark.parametrize(("scale_shape", "first", "fused"),
                         [((1, 4, 1, 1), True, True), ((4, 1, 1), False, True), ((1,), True, True),
                          ((1, 1, 5, 5), True, False), ((1, 1, 4, 1, 1), True, False)])
def test_per_channel_scale_folds_into_conv(scale_shape: tuple[int, ...], first: bool, fused: bool) -> None:
    """A batch norm spelled Mul, Add (BN-Inception) becomes the conv's weights, bias and activation."""
    b = Builder(None, 3, 5, 5)
    y = b("conv", "x", b.const(normal(4, 3, 3, 3)), b.const(normal(4)), pads=[1, 1, 1, 1])
    scale = b.const(normal(*scale_shape))
    scaled = b("mul", y, scale) if first else b("mul", scale, y)
    graph = b.done(b("relu", b("add", scaled, b.const(normal(1, 4, 1, 1)))))
    assert ops(fold_scale(graph)) == (["conv", "add", "relu"] if fused else ["conv", "mul", "add", "relu"])
    result = optimize(graph)
    assert ops(result) == (["conv"] if fused else ["conv", "mul", "add", "relu"])
    assert_same_results(graph, result, normal(2, 3, 5, 5))


def test_dense_scale_folds_along_its_features() -> None:
    b = Builder(None, 5)
    graph = b.done(b("mul", b("dense", "x", b.const(normal(5, 4))), b.const(normal(4))))
    result = fold_scale(graph)
    assert ops(result) == ["dense"]
    assert_same_results(graph, result, normal(3, 5))


def test_dense_bias_must_vary_along_features_only() -> None:
    b = Builder(None, 3, 5)
    y = b("dense", "x", b.const(normal(5, 4)))
    graph = b.done(b("add", y, b.const(normal(3, 1))))  # varies along axis 1 of (N, 3, 4)
    assert ops(fuse_bias(graph)) == ["dense", "add"]
    b = Builder(None, 3, 5)
    graph = b.done(b("add", b("dense", "x", b.const(normal(5, 4))), b.const(normal(1, 4))))
    assert ops(fuse_bias(graph)) == ["dense"]
    assert_same_results(graph, fuse_bias(graph), normal(2, 3, 5))


def test_activations_fuse_with_their_attributes() -> None:
    b = Builder(None, 3, 5, 5)
    conv = b("leaky_relu", b("conv", "x", b.const(normal(4, 3, 3, 3))), alpha=0.2)
    dense = b("softmax", b("dense", b("flatten", conv), b.const(normal(36, 3))))
    graph = b.done(dense)
    fused = fuse_activations(graph)
    assert ops(fused) == ["conv", "flatten", "dense", "softmax"]  # softmax is not elementwise: not fused
    assert fused.nodes[0].attrs == {"activation": "leaky_relu", "activation_attrs": {"alpha": 0.2}}
    assert fused.nodes[0].outputs == [conv]
    assert_same_results(graph, fused, normal(2, 3, 5, 5))


def test_constant_subgraphs_fold_and_weights_transposed_at_run_time_become_dense() -> None:
    b = Builder(None, 4)
    weight = b("transpose", b.const(normal(3, 4)), perm=[1, 0])  # (4, 3), as ONNX Gemm(transB=1) spells it
    bias = b("mul", b.const(normal(3)), b.const(np.float32(2.0)))
    graph = b.done(b("add", b("matmul", "x", weight), bias))
    folded = fold_constants(graph)
    assert ops(folded) == ["matmul", "add"]
    assert set(folded.constants) == {weight, bias}
    optimized = optimize(graph)
    assert ops(optimized) == ["dense"]
    assert_same_results(graph, optimized, normal(3, 4))


def test_a_graph_output_computed_from_constants_only_becomes_a_constant() -> None:
    b = Builder(None, 2)
    constant = b("add", b.const(normal(2)), b.const(normal(2)))
    graph = b.done(b("relu", "x"), constant)
    folded = fold_constants(graph)
    assert ops(folded) == ["relu"]
    assert_same_results(graph, folded, normal(3, 2))


def test_identities_disappear_but_output_names_stay() -> None:
    b = Builder(None, 2)
    middle = b("identity", b("relu", "x"))
    out = b("identity", b("tanh", middle))
    passthrough = b("identity", "x")
    graph = b.done(out, passthrough)
    cleaned = remove_identities(graph)
    assert ops(cleaned) == ["relu", "tanh", "identity"]  # x -> output: both names are the interface
    assert cleaned.nodes[1].outputs == [out]
    assert_same_results(graph, cleaned, normal(3, 2))


def resnet_block_graph() -> Graph:
    b = Builder(None, 3, 8, 8)
    stem = b("relu", b.batch_norm(b("conv", "x", b.const(normal(4, 3, 3, 3)), pads=[1, 1, 1, 1]), 4))
    inner = b("relu", b.batch_norm(b("conv", stem, b.const(normal(4, 4, 3, 3)), pads=[1, 1, 1, 1]), 4))
    inner = b.batch_norm(b("conv", inner, b.const(normal(4, 4, 3, 3)), pads=[1, 1, 1, 1]), 4)
    block = b("relu", b("add", inner, stem))
    pooled = b("flatten", b("global_avg_pool", block))
    logits = b("add", b("matmul", pooled, b("identity", b.const(normal(4, 10)))), b.const(normal(1, 10)))
    return b.done(logits)


def test_optimize_brings_a_residual_block_into_canonical_form() -> None:
    graph = resnet_block_graph()
    count = len(graph.nodes)
    optimized = optimize(graph)
    assert [(n.op, OPS[n.op].resolve(n.attrs).get("activation", "-")) for n in optimized.nodes] == [
        ("conv", "relu"),
        ("conv", "relu"),
        ("conv", "none"),
        ("add", "-"),
        ("relu", "-"),
        ("global_avg_pool", "-"),
        ("flatten", "-"),
        ("dense", "none"),
    ]
    assert_same_results(graph, optimized, normal(2, 3, 8, 8))
    assert optimize(optimized).content_hash() == optimized.content_hash()
    assert len(graph.nodes) == count  # the argument is left alone
