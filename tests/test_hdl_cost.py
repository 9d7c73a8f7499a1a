"""The hardware-cost objective: da4ml's estimate layer by layer, the capability naming it, the recipe asking it,
and the mixed-precision strategy minimising it."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest
from test_da4ml_plugin import DA4ML, fixed_point_mlp
from test_quantize import mlp_graph

from dabuild.capability import load_capability
from dabuild.errors import BuildError, ValidationError
from dabuild.ir.interpreter import run
from dabuild.progress import Progress
from dabuild.quant.calibrate import calibrate
from dabuild.quant.quantize import quantize
from dabuild.recipe import load_recipe
from dabuild.resources import data_dir
from dabuild.tune.evaluate import EvalSetup, Evaluator
from dabuild.tune.mixed_precision import MixedPrecisionStrategy
from dabuild.tune.objective import make_objective, resolve_objective
from dabuild.tune.scorer import Scorer
from dabuild.tune.search import Budget, Goal, Search
from dabuild.tune.space import build_space, dtype_bits
from dabuild.tune.strategy import width_steps
from dabuild.tune.trials import TrialStore

pytest.importorskip("da4ml")

from da4ml.trace import HWConfig

from dabuild.targets.hdl.cost import Da4mlCost
from dabuild.targets.hdl.program import trace

REPO = Path(__file__).resolve().parent.parent
C = load_capability(data_dir("capabilities") / "c.yaml")


def full_trace_cost(qgraph) -> float:
    return float(trace(qgraph, HWConfig(1, -1, -1)).cost)


def test_one_layer_estimate_with_the_solver_defaults_is_the_full_trace() -> None:
    graph = mlp_graph([6, 5], ["none"], seed=3)
    x = np.random.default_rng(4).normal(size=(256, 6)).astype(np.float32)
    stats = calibrate(graph, [{"x": x}], Progress.silent())
    config = build_space(graph, DA4ML).default()
    qgraph = quantize(graph, stats, config)
    full = full_trace_cost(qgraph)
    assert Da4mlCost(solver_options={})(qgraph) == full > 0
    assert abs(Da4mlCost()(qgraph) - full) <= 0.05 * full  # the faster solver setting the tuner uses


def test_estimate_tracks_the_full_trace_and_each_layer_is_traced_once() -> None:
    qgraph = fixed_point_mlp("per_channel")
    model = Da4mlCost()
    estimate = model(qgraph)
    assert model.traced == len(qgraph.layers)
    assert abs(estimate - full_trace_cost(qgraph)) <= 0.1 * full_trace_cost(qgraph)
    assert model(qgraph) == estimate and model.traced == len(qgraph.layers)  # all from the cache


def test_changing_one_layer_retraces_only_that_layer() -> None:
    qgraph = fixed_point_mlp()
    model = Da4mlCost()
    before = model(qgraph)
    last = qgraph.layers[-1]
    narrower = dataclasses.replace(last, weight=(last.weight // 2).astype(last.weight.dtype))
    changed = dataclasses.replace(qgraph, layers=[*qgraph.layers[:-1], narrower])
    after = model(changed)
    assert model.traced == len(qgraph.layers) + 1
    assert after != before and after == Da4mlCost()(changed)


def test_the_capability_names_its_cost_model_and_unknown_names_are_refused(tmp_path: Path) -> None:
    assert DA4ML.cost_model == "da4ml" and C.cost_model is None
    text = (data_dir("capabilities") / "c.yaml").read_text() + "\ncost_model: da4mll\n"
    (tmp_path / "c.yaml").write_text(text)
    with pytest.raises(ValidationError, match=r"unknown cost model 'da4mll' \(did you mean 'da4ml'\?\)"):
        load_capability(tmp_path / "c.yaml")


def test_objective_defaults_to_the_capability_estimate_else_size() -> None:
    assert resolve_objective(None, DA4ML) == "estimate"
    assert resolve_objective(None, C) == "size"
    assert resolve_objective("bops", DA4ML) == "bops"
    with pytest.raises(BuildError, match="capability 'c' names no cost_model"):
        resolve_objective("estimate", C)


def recipe_copy(tmp_path: Path, name: str, edit: str) -> Path:
    folder = tmp_path / name
    shutil.copytree(REPO / "recipes" / name, folder, ignore=shutil.ignore_patterns("build", "__pycache__"))
    recipe = folder / "recipe.yaml"
    recipe.write_text(recipe.read_text().replace("tuning:\n", f"tuning:\n  {edit}\n", 1))
    return recipe


def test_recipe_asking_an_estimate_of_a_capability_without_one_is_an_error_at_the_objective(tmp_path: Path) -> None:
    recipe = recipe_copy(tmp_path, "digits", "objective: estimate")
    with pytest.raises(ValidationError) as caught:
        load_recipe(recipe)
    [diagnostic] = caught.value.diagnostics
    line = recipe.read_text().splitlines().index("  objective: estimate") + 1
    assert diagnostic.line == line and "capability 'c'" in diagnostic.message and "no cost_model" in diagnostic.message
    assert load_recipe(recipe_copy(tmp_path / "other", "jet-mlp", "seed: 0")).tuning.objective == "estimate"


def test_width_steps_go_one_width_down_in_one_role() -> None:
    graph = mlp_graph([6, 5], ["relu"], seed=3)
    node = build_space(graph, DA4ML).nodes["fc1"]
    current = node.default
    steps = width_steps(node, current)
    assert steps and len(steps) < len(node.candidates)
    for step in steps:
        moved = [role for role in ("weight", "activation") if getattr(step, role) != getattr(current, role)]
        assert len(moved) == 1
        [role] = moved
        below = {dtype_bits(getattr(c, role).dtype) for c in node.candidates
                 if dtype_bits(getattr(c, role).dtype) < dtype_bits(getattr(current, role).dtype)}
        assert dtype_bits(getattr(step, role).dtype) == max(below)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> Evaluator:
    """A 8-16-4 classifier whose labels are its own float argmax on 400 samples: float accuracy 1."""
    folder = tmp_path_factory.mktemp("synthetic")
    graph = mlp_graph([8, 16, 4], ["relu", "none"], seed=11)
    x = np.random.default_rng(12).normal(size=(400, 8)).astype(np.float32)
    labels = np.argmax(run(graph, {"x": x})[graph.outputs[0]], axis=1)
    graph.save(folder / "graph")
    calibrate(graph, [{"x": x}], Progress.silent()).save(folder / "stats")
    return Evaluator(EvalSetup(folder / "graph", folder / "stats", x, labels, "accuracy", 400))


def test_mixed_precision_lowers_the_estimate_and_keeps_the_goal(synthetic: Evaluator) -> None:
    space = build_space(synthetic.graph, DA4ML)
    objective = make_objective(None, space, DA4ML, synthetic.quantize)
    assert objective.name == "estimate" and objective.unit == "LUTs"
    with Scorer(synthetic) as scorer:
        search = Search(space, synthetic, scorer, TrialStore(None, ""), Goal("relative", 0.1), objective,
                        Budget(30), Progress.silent())
        chosen = search.run(MixedPrecisionStrategy())
    assert chosen is not None and chosen.passed
    default = objective.cost(space.default())
    assert chosen.cost < default
    assert chosen.cost == round(Da4mlCost()(synthetic.quantize(chosen.config)))
    cheaper_failing = [t for t in search.trials if t.cost < chosen.cost]
    assert all(not t.passed for t in cheaper_failing)  # nothing cheaper that passed was left behind
