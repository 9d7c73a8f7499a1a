"""The graph IR: shape rules, files, content hash, interpreter, passes."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from dabuild.errors import BuildError, UsageError
from dabuild.ir import Graph, Node, TensorSpec
from dabuild.ir.interpreter import run
from dabuild.ir.passes import canonicalize_dense, fuse_activations, fuse_bias, optimize, remove_dead_code

RNG = np.random.default_rng(7)


def constant(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def mlp_graph(prefix: str = "") -> Graph:
    """x -> matmul -> add -> relu -> matmul -> add, spelled as a frontend would emit it."""
    p = prefix
    return Graph(
        inputs=[TensorSpec("x", (None, 4))],
        outputs=[f"{p}y"],
        nodes=[
            Node(f"{p}mm0", "matmul", ["x", f"{p}w0"], [f"{p}h0"], {}),
            Node(f"{p}add0", "add", [f"{p}h0", f"{p}b0"], [f"{p}h1"], {}),
            Node(f"{p}relu0", "relu", [f"{p}h1"], [f"{p}h2"], {}),
            Node(f"{p}mm1", "matmul", [f"{p}h2", f"{p}w1"], [f"{p}h3"], {}),
            Node(f"{p}add1", "add", [f"{p}b1", f"{p}h3"], [f"{p}y"], {}),
        ],
        constants={f"{p}w0": W0, f"{p}b0": B0, f"{p}w1": W1, f"{p}b1": B1},
    )


W0, B0, W1, B1 = constant(4, 5), constant(5), constant(5, 3), constant(1, 3)


def numpy_mlp(x: np.ndarray) -> np.ndarray:
    return np.maximum(x @ W0 + B0, 0) @ W1 + B1


def test_shape_inference_covers_every_tensor_with_dynamic_batch() -> None:
    graph = mlp_graph()
    graph.nodes.append(Node("r", "reshape", ["y"], ["r"], {"shape": [0, 3, -1]}))
    graph.nodes.append(Node("f", "flatten", ["r"], ["f"], {}))
    graph.nodes.append(Node("s", "softmax", ["f"], ["s"], {}))
    shapes = {name: spec.shape for name, spec in graph.tensor_shapes().items()}
    assert shapes["h0"] == (None, 5)
    assert shapes["y"] == (None, 3)
    assert shapes["r"] == (None, 3, 1)
    assert shapes["f"] == (None, 3)
    assert shapes["s"] == (None, 3)


@pytest.mark.parametrize(
    ("node", "message"),
    [
        (Node("bad", "matmul", ["x", "w1"], ["o"], {}), "inner dimensions differ"),
        (Node("bad", "add", ["x", "w0"], ["o"], {}), "do not broadcast"),
        (Node("bad", "lstm", ["x"], ["o"], {}), "unknown op"),
        (Node("bad", "relu", ["nowhere"], ["o"], {}), "'nowhere' before anything writes it"),
        (Node("bad", "reshape", ["w0"], ["o"], {"shape": [3, -1]}), "cannot reshape"),
        (Node("bad", "dense", ["x", "w0"], ["o"], {"activation": "softmax"}), "activation 'softmax'"),
    ],
)
def test_shape_inference_names_the_failing_node(node: Node, message: str) -> None:
    graph = mlp_graph()
    graph.nodes.insert(0, node)
    with pytest.raises(BuildError, match="node 'bad'") as error:
        graph.tensor_shapes()
    assert message in str(error.value)


def test_save_load_round_trip_is_byte_identical(tmp_path: Path) -> None:
    graph = mlp_graph()
    graph.save(tmp_path / "a")
    loaded = Graph.load(tmp_path / "a")
    loaded.save(tmp_path / "b")
    for name in ("graph.json", "weights.npz"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert loaded.nodes == graph.nodes
    assert loaded.inputs == graph.inputs
    for name, array in graph.constants.items():
        np.testing.assert_array_equal(loaded.constants[name], array)


def test_load_rejects_foreign_json(tmp_path: Path) -> None:
    mlp_graph().save(tmp_path)
    (tmp_path / "graph.json").write_text('{"format": "other", "version": 1}')
    with pytest.raises(BuildError, match="graph.json: not a dabuild-graph"):
        Graph.load(tmp_path)


def test_content_hash_ignores_names_but_not_weights() -> None:
    plain, renamed = mlp_graph(), mlp_graph(prefix="layer_")
    assert plain.content_hash() == renamed.content_hash()
    changed = mlp_graph()
    changed.constants["w1"] = changed.constants["w1"].copy()
    changed.constants["w1"][0, 0] += 1e-3
    assert changed.content_hash() != plain.content_hash()
    retyped = replace(plain, inputs=[TensorSpec("x", (None, 4), "float16")])
    assert retyped.content_hash() != plain.content_hash()


def test_interpreter_matches_numpy() -> None:
    x = constant(6, 4)
    graph = mlp_graph()
    outputs = run(graph, {"x": x})
    assert list(outputs) == ["y"]
    np.testing.assert_allclose(outputs["y"], numpy_mlp(x), rtol=1e-6, atol=1e-6)
    every = run(graph, {"x": x}, keep_intermediates=True)
    np.testing.assert_allclose(every["h2"], np.maximum(x @ W0 + B0, 0), rtol=1e-6, atol=1e-6)
    assert "w0" not in every


@pytest.mark.parametrize(
    ("feeds", "message"),
    [
        ({"x": np.zeros((2, 5))}, "'x' has shape [2, 5]; expected [?, 4]"),
        ({}, "missing graph input 'x' (expected shape [?, 4])"),
        ({"x": np.zeros((2, 4)), "z": np.zeros(1)}, "unknown graph input 'z'"),
    ],
)
def test_interpreter_rejects_bad_feeds(feeds: dict[str, np.ndarray], message: str) -> None:
    with pytest.raises(UsageError) as error:
        run(mlp_graph(), feeds)
    assert message in str(error.value)


def test_dead_code_removal_drops_unused_nodes_and_constants() -> None:
    graph = mlp_graph()
    graph.constants["unused"] = constant(4, 2)
    graph.nodes.insert(1, Node("side", "matmul", ["x", "unused"], ["side_out"], {}))
    pruned = remove_dead_code(graph)
    assert [n.name for n in pruned.nodes] == [n.name for n in mlp_graph().nodes]
    assert "unused" not in pruned.constants
    assert len(graph.nodes) == 6  # the argument is left alone


def test_passes_canonicalise_to_fused_dense_and_keep_results() -> None:
    graph = mlp_graph()
    dense = fuse_bias(canonicalize_dense(graph))
    assert [n.op for n in dense.nodes] == ["dense", "relu", "dense"]
    assert dense.constants[dense.nodes[2].inputs[2]].shape == (3,)  # (1, 3) bias stored as (3,)
    fused = fuse_activations(dense)
    assert [(n.op, n.attrs["activation"]) for n in fused.nodes] == [("dense", "relu"), ("dense", "none")]
    assert optimize(graph).content_hash() == fused.content_hash()
    x = constant(5, 4)
    np.testing.assert_allclose(run(fused, {"x": x})["y"], numpy_mlp(x), rtol=1e-6, atol=1e-6)


def test_fusion_keeps_tensors_that_others_read() -> None:
    graph = mlp_graph()
    graph.outputs.append("h1")  # the pre-relu value is an output itself: relu must stay separate
    optimized = optimize(graph)
    assert [n.op for n in optimized.nodes] == ["dense", "relu", "dense"]
    x = constant(2, 4)
    before, after = run(graph, {"x": x}), run(optimized, {"x": x})
    for name in graph.outputs:
        np.testing.assert_allclose(after[name], before[name], rtol=1e-6, atol=1e-6)


def test_matmul_by_non_constant_stays_matmul() -> None:
    graph = Graph(
        inputs=[TensorSpec("a", (None, 3)), TensorSpec("b", (3, 2))],
        outputs=["c"],
        nodes=[Node("mm", "matmul", ["a", "b"], ["c"], {})],
        constants={},
    )
    assert [n.op for n in optimize(graph).nodes] == ["matmul"]
