"""The tuner choosing int16 activations per layer (mixed 8/16) where a capability offers them.

An MLP whose fc1 has one outlier unit (300 times the others, which fc2 does not read): fc1's per-tensor int8 grid
then loses the small units and no all-int8 config meets a 2.5 % goal. With int16 asked for dense activations (tuning.space; the c capability offers it), the space counts
each int16 activation's extra byte a value (`TuningSpace.wide_activation_bits`, in `size`), so the cheapest
config that meets the goal holds int16 on fc1 alone; the c target runs that mixed config (int8 in, int16 between
fc1 and fc2, int8 out) to the integer reference's very integers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from test_quantize import mlp_graph
from test_strategies import run_search
from test_tuning import C

from dabuild.ir import interpreter
from dabuild.ir.graph import Graph
from dabuild.progress import Progress
from dabuild.qir.reference import quantize_input, run_integer
from dabuild.quant.calibrate import Stats, calibrate
from dabuild.quant.quantize import quantize
from dabuild.targets.c import CTarget
from dabuild.tune.evaluate import EvalSetup, Evaluator
from dabuild.tune.search import Goal
from dabuild.tune.space import build_space

# The shipped c capability, int16 asked for dense activations; one weight and activation scheme each.
SIXTEEN = {"op_type": {"dense": {"activation": {"dtype": ["int8", "int16"], "scheme": ["sym"], "algorithm": ["minmax"]},
                                 "weight": {"granularity": ["per_channel"], "algorithm": ["minmax"]}}}}


def test_int16_activations_enter_the_space_on_request_and_only_where_every_reader_takes_them() -> None:
    """By default the space holds the c capability's int8 activations only; asked for, int16 stays off a node
    an op without 16-bit kernels reads (sigmoid: a table over int8)."""
    from test_lowering import graph_of

    from dabuild.ir.graph import Node

    rng = np.random.default_rng(0)
    graph = graph_of([Node("fc1", "dense", ["x", "w1", "b1"], ["h"], {}), Node("squash", "sigmoid", ["h"], ["s"], {}),
                      Node("fc2", "dense", ["s", "w2", "b2"], ["y"], {})], (4,),
                     {"w1": rng.normal(size=(4, 4)), "b1": rng.normal(size=4), "w2": rng.normal(size=(4, 2)),
                      "b2": rng.normal(size=2)})
    plain = build_space(graph, C)
    assert {c.activation.dtype for node in plain.nodes.values() for c in node.candidates if c.activation} == {"int8"}
    asked = build_space(graph, C, SIXTEEN)
    assert {c.activation.dtype for c in asked.nodes["fc1"].candidates} == {"int8"}    # sigmoid reads it
    assert {c.activation.dtype for c in asked.nodes["fc2"].candidates} == {"int8", "int16"}


def outlier_mlp(folder: Path) -> tuple[Evaluator, Graph]:
    graph = mlp_graph([16, 24, 16, 10], ["relu", "relu", "none"], seed=5)
    graph.constants["w1"][:, 0] *= 300
    graph.constants["b1"][0] = abs(graph.constants["b1"][0]) * 300
    graph.constants["w2"][0] = 0
    x = np.random.default_rng(1).normal(size=(600, 16)).astype(np.float32)
    graph.save(folder / "graph")
    calibrate(graph, [{"x": x[:200]}], Progress.silent()).save(folder / "stats")
    labels = interpreter.run(graph, {"x": x[200:]})["h3"].argmax(axis=1)
    return Evaluator(EvalSetup(folder / "graph", folder / "stats", x[200:], labels, "accuracy", 200)), \
        Graph.load(folder / "graph")


def test_the_tuner_puts_int16_on_the_one_layer_whose_accuracy_needs_it(tmp_path: Path) -> None:
    evaluator, graph = outlier_mlp(tmp_path)
    space = build_space(graph, C, SIXTEEN)
    assert space.total() == 8
    goal = Goal("relative", 0.025)
    default = space.default()
    assert not goal.passes(evaluator.baseline, evaluator.score(default).metric, True)
    _, chosen = run_search(evaluator, space, "exhaustive", goal)
    assert chosen is not None and chosen.passed
    dtypes = {name: choice.activation.dtype for name, choice in chosen.config.nodes.items() if choice.activation}
    assert dtypes == {"fc1": "int16", "fc2": "int8", "fc3": "int8"}
    assert space.size(chosen.config) == space.size(default) + 8 * space.nodes["fc1"].activation_size

    qgraph = quantize(graph, Stats.load(tmp_path / "stats"), chosen.config)
    target = CTarget()
    artifact = tmp_path / "artifact"
    artifact.mkdir()
    target.export(qgraph, artifact)
    x = np.random.default_rng(4).normal(size=(32, 16)).astype(np.float32)
    x_q = quantize_input(qgraph, x)
    expected = run_integer(qgraph, x_q)
    assert np.array_equal(target.run(artifact, x_q, tmp_path), expected.reshape(len(x), -1))
