"""Every registered strategy on the digits MLP, and `basic` against Intel Neural Compressor's basic order.

The 1 % relative accuracy goal is met by the default int8 config on this net,
at the least size the space allows, so each strategy stops there (`basic`
after a bounded look for a better score at that size); a continuous metric (the negative
log-likelihood, a user metric) with a 0.1 % goal makes them search.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from dabuild.plugins import STRATEGIES, available
from dabuild.quant.config import QuantConfig
from dabuild.tune.evaluate import EvalSetup, Evaluator
from dabuild.tune.search import Goal
from dabuild.tune.space import FP32, TuningSpace, build_space

sys.path.insert(0, str(Path(__file__).parent))
from test_mixed_precision import cnn  # noqa: F401 - the digits CNN, traced and calibrated (needs torch)
from test_tuning import C_FALLBACK, NLL_GOAL, C, digits_recipe, digits_stages, nll_recipe_dir, tune  # noqa: F401

STRATEGY_NAMES = ["basic", "sensitivity", "exhaustive", "random", "bayesian", "mixed-precision", "accuracy-control"]


def inc_basic_trials(space: TuningSpace, score, passes, higher_is_better: bool = False) -> int | None:
    """Trials Intel Neural Compressor's basic strategy needs to first meet the goal on `space`, or None.

    Its order: the default config; op-type-wise, each other quantization
    choice on every node of an op type (the best becomes the base); op-wise,
    each node's fp32 fallback in graph order; then the fallbacks accumulated,
    best-scoring first. `score(config)` -> metric, `passes(metric)` -> bool.
    """
    sign = -1 if higher_is_better else 1
    tried: dict[str, float] = {}

    def trial(config: QuantConfig) -> bool:
        key = config.content_hash()
        if key not in tried:
            tried[key] = score(config)
        return passes(tried[key])

    default = base = space.default()
    if trial(base):
        return len(tried)
    for op in dict.fromkeys(node.op for node in space.nodes.values()):
        members = [n for n in space.nodes.values() if n.op == op]
        for choice in dict.fromkeys(c for n in members for c in n.candidates if c != FP32):
            config = QuantConfig({**default.nodes, **{n.name: choice for n in members if choice in n.candidates}})
            if trial(config):
                return len(tried)
            if sign * tried[config.content_hash()] < sign * tried[base.content_hash()]:
                base = config
    fallbacks = {}
    for name, node in space.nodes.items():
        if FP32 in node.candidates:
            config = space.with_node(base, name, FP32)
            if trial(config):
                return len(tried)
            fallbacks[name] = tried[config.content_hash()]
    config = base
    for name in sorted(fallbacks, key=lambda name: sign * fallbacks[name]):
        config = space.with_node(config, name, FP32)
        if trial(config):
            return len(tried)
    return None


def test_every_strategy_is_registered() -> None:
    assert set(STRATEGY_NAMES) <= set(available(STRATEGIES))


@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
def test_strategy_meets_a_one_percent_goal_on_digits(strategy: str, digits_stages: tuple[Path, Path],  # noqa: F811 - the fixture
                                                     tmp_path: Path) -> None:
    if strategy == "bayesian":
        pytest.importorskip("optuna")
    metrics = tune(digits_stages, tmp_path / "out", digits_recipe(strategy=strategy), C_FALLBACK, tmp_path / "t")
    history = metrics["history"]
    assert metrics["goal_met"] and metrics["quantized"] >= 0.99 * metrics["fp32"]
    assert history[0]["passed"] and "least size" in metrics["stop_reason"]  # the int8 default is cheapest
    assert len(history) == 1  # its cost can no longer fall: every strategy stops there
    assert metrics["size_bits"] == history[0]["cost"] and metrics["quantized"] == history[0]["metric"]


@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
def test_strategy_searches_until_a_strict_goal_is_met(strategy: str, digits_stages: tuple[Path, Path],  # noqa: F811 - the fixture
                                                      tmp_path: Path) -> None:
    if strategy == "bayesian":
        pytest.importorskip("optuna")
    folder = nll_recipe_dir(tmp_path)
    recipe = digits_recipe(folder, strategy=strategy, accuracy=NLL_GOAL, max_trials=60)
    metrics = tune(digits_stages, tmp_path / "out", recipe, C_FALLBACK, tmp_path / "t")
    history = metrics["history"]
    assert metrics["goal_met"] and not history[0]["passed"] and len(history) > 1
    assert metrics["quantized"] <= metrics["fp32"] * 1.001
    cheapest = min(t["cost"] for t in history if t["passed"])
    assert metrics["size_bits"] == cheapest  # the objective picks among passing trials


def test_basic_on_the_digits_cnn_stops_at_the_first_config_of_the_least_size(
        cnn: tuple[Path, tuple[Path, Path]], tmp_path: Path) -> None:  # noqa: F811 - the fixture
    """The default int8 config passes a 1 % goal on the digits CNN at the least size the c capability allows:
    no config can be cheaper, so basic stops there, trying none of the configs of equal size."""
    folder, stages = cnn
    metrics = tune(stages, tmp_path / "tune", digits_recipe(folder, strategy="basic"), C)
    history = metrics["history"]
    assert [t["step"] for t in history] == ["default"] and history[0]["passed"]
    assert metrics["chosen_trial"] == 0 and "least size" in metrics["stop_reason"]


def test_basic_needs_no_more_trials_than_inc_basic_order(digits_stages: tuple[Path, Path], tmp_path: Path) -> None:  # noqa: F811 - the fixture
    folder = nll_recipe_dir(tmp_path)
    recipe = digits_recipe(folder, strategy="basic", accuracy=NLL_GOAL)
    data = np.load(folder / "data.npz")
    evaluator = Evaluator(EvalSetup(*digits_stages, data["x_test"].astype(np.float32), data["y_test"],
                                    "nll.py:nll", 64, metric_file=folder / "nll.py"))
    from dabuild.ir.graph import Graph

    space = build_space(Graph.load(digits_stages[0]), C_FALLBACK)
    goal = Goal(**NLL_GOAL)
    inc = inc_basic_trials(space, lambda c: evaluator.score(c).metric,
                           lambda m: goal.passes(evaluator.baseline, m, higher_is_better=False))
    metrics = tune(digits_stages, tmp_path / "out", recipe, C_FALLBACK, tmp_path / "t")
    first_pass = next(t["trial"] for t in metrics["history"] if t["passed"]) + 1
    assert inc is not None and first_pass <= inc


# ---------------------------------------------------------------- accuracy-control and basic on small graphs


def spread_mlp(tmp_path: Path, spread: float = 2.0 ** 7) -> tuple[Evaluator, object]:
    """A dense MLP whose first hidden layer's units are rescaled over 1/spread..spread (the next layer divides
    them back: the float function is unchanged), so its per-tensor output grid loses the small units; labels
    are the float model's own argmax (fp32 accuracy 1). Saved and calibrated; its evaluator and graph."""
    from test_quantize import mlp_graph

    from dabuild.ir.graph import Graph
    from dabuild.progress import Progress
    from dabuild.quant.calibrate import calibrate

    graph = mlp_graph([16, 24, 16, 10], ["relu", "relu", "none"], seed=5)
    factor = (spread ** np.linspace(-1, 1, 24)).astype(np.float32)
    graph.constants["w1"] = graph.constants["w1"] * factor
    graph.constants["b1"] = graph.constants["b1"] * factor
    graph.constants["w2"] = graph.constants["w2"] / factor[:, None]
    x = np.random.default_rng(1).normal(size=(600, 16)).astype(np.float32)
    graph.save(tmp_path / "graph")
    calibrate(graph, [{"x": x[:200]}], Progress.silent()).save(tmp_path / "stats")
    from dabuild.ir import interpreter

    labels = interpreter.run(graph, {"x": x[200:]})["h3"].argmax(axis=1)
    return Evaluator(EvalSetup(tmp_path / "graph", tmp_path / "stats", x[200:], labels, "accuracy", 200)), \
        Graph.load(tmp_path / "graph")


def run_search(evaluator: Evaluator, space: TuningSpace, strategy: str, goal: Goal, max_trials: int = 100):
    from dabuild.plugins import load
    from dabuild.progress import Progress
    from dabuild.tune.scorer import Scorer
    from dabuild.tune.search import Budget, Search
    from dabuild.tune.trials import TrialStore

    search = Search(space, evaluator, Scorer(evaluator), TrialStore(None, "x"), goal, "size", Budget(max_trials),
                    Progress.silent())
    return search, search.run(load(STRATEGIES, strategy)())


def test_accuracy_control_restores_the_harmful_node_in_few_full_evaluations(tmp_path: Path) -> None:
    """Everything int8 misses (fc1's per-tensor output grid loses the small units) on the subset already, so it
    costs no full evaluation; ranking by what restoring each node alone recovers on the subset finds fc2, whose
    float island keeps fc1's output in float: the first full evaluation passes."""
    from dabuild.tune.accuracy_control import cheapest_choice

    evaluator, graph = spread_mlp(tmp_path)
    space = build_space(graph, C_FALLBACK)
    cheapest = QuantConfig({name: cheapest_choice(node) for name, node in space.nodes.items()})
    search, chosen = run_search(evaluator, space, "accuracy-control", Goal("relative", 0.02))
    assert not search.subset_passes(cheapest) and not Goal("relative", 0.02).passes(
        evaluator.baseline, evaluator.score(cheapest).metric, True)  # the full set agrees: the skip cost nothing
    assert [t.step for t in search.trials] == ["restore fc2"] and chosen is search.trials[0] and chosen.passed
    assert search.harmful[0] == "fc2" and chosen.config == space.with_node(cheapest, "fc2", FP32)
    assert search.subset_evaluations > 0 and len(search.subset_rows) == 300


def test_accuracy_control_takes_back_restorations_no_longer_needed(tmp_path: Path) -> None:
    """A loose goal the cheapest config already meets: one full evaluation, nothing restored."""
    evaluator, graph = spread_mlp(tmp_path, spread=1.0)
    space = build_space(graph, C_FALLBACK)
    search, chosen = run_search(evaluator, space, "accuracy-control", Goal("relative", 0.05))
    assert chosen is not None and chosen.passed and len(search.trials) == 1
    assert "least size" in search.stop_reason and "phase cheapest" in search.stop_reason


def test_a_goal_no_config_meets_keeps_the_best_and_names_the_most_harmful_nodes(tmp_path: Path) -> None:
    evaluator, graph = spread_mlp(tmp_path)
    space = build_space(graph, C)  # no float islands: fc1's output stays on one int8 grid
    search, chosen = run_search(evaluator, space, "accuracy-control", Goal("absolute", 0.0))
    assert chosen is not None and not chosen.passed and len(search.trials) <= 10
    assert chosen.metric == max(t.metric for t in search.trials)
    assert len(search.harmful_nodes()) == 3 and set(search.harmful_nodes()) == {"fc1", "fc2", "fc3"}


def test_basic_reaches_fallback_within_the_default_budget_on_a_large_space(tmp_path: Path) -> None:
    """onnxruntime's capability gives each node 64 integer candidates: INC's op-type-wise enumeration would
    spend the whole budget; basic samples it within a quarter and reaches op-wise fp32 fallback, which meets
    the goal, and its stop reason names the phase that ended it."""
    from dabuild.capability import load_capability
    from dabuild.resources import data_dir

    evaluator, graph = spread_mlp(tmp_path)
    space = build_space(graph, load_capability(data_dir("capabilities") / "onnxruntime.yaml"))
    assert sum(len(node.candidates) - 1 for node in space.nodes.values()) > 100
    search, chosen = run_search(evaluator, space, "basic", Goal("relative", 0.01))
    steps = [t.step for t in search.trials]
    assert steps.count("op-type-wise") <= 25 and "op-wise" in steps
    assert chosen is not None and chosen.passed and any(c == FP32 for c in chosen.config.nodes.values())
    assert "phase" in search.stop_reason


def test_basic_tries_cheaper_configs_after_a_pass(tmp_path: Path) -> None:
    """int8 passes a loose goal at once, and so does every weight at int4: basic keeps looking until every
    layer is at the narrowest width that passes."""
    from test_mixed_precision import INT4_CAPABILITY

    evaluator, graph = spread_mlp(tmp_path, spread=1.0)
    space = build_space(graph, INT4_CAPABILITY)
    search, chosen = run_search(evaluator, space, "basic", Goal("relative", 0.5))
    assert search.trials[0].passed
    assert chosen is not None and chosen.passed and chosen.cost == space.floor("size")
    assert all(c.weight.dtype == "int4" for c in chosen.config.nodes.values())


def test_the_subset_holds_the_rows_near_the_float_decisions(tmp_path: Path) -> None:
    """For accuracy the subset is two thirds the rows with the least float margin (top-1 minus top-2), one third
    spread over the rest, and its estimate is the whole set's metric: on a model where int8 flips only a few
    samples, exactly the full accuracy of every config one choice away from the default (no trial spent)."""
    evaluator, graph = spread_mlp(tmp_path, spread=1.0)
    space = build_space(graph, C_FALLBACK)
    rows = evaluator.subset(300)
    ordered = np.sort(evaluator.float_outputs, axis=1)
    margin = ordered[:, -1] - ordered[:, -2]
    assert evaluator.subset_is_marginal and len(rows) == 300 and len(evaluator.setup.x) == 400
    assert set(np.argsort(margin)[:200]) <= set(rows) and np.median(margin[rows]) < np.median(margin)
    configs = [space.default(), *(space.with_node(space.default(), name, choice)
                                  for name, node in space.nodes.items() for choice in node.candidates)]
    assert evaluator.score(space.default()).metric < 1.0  # int8 flips some samples
    assert all(evaluator.subset_metric(c, rows) == evaluator.score(c).metric for c in configs)


def test_a_subset_score_that_went_with_a_full_miss_predicts_no_pass(tmp_path: Path) -> None:
    """Near the goal the subset's verdict is noise: a config the subset passes but the full set fails makes
    every config the subset scores no better than it a predicted miss (not worth a full evaluation), while a
    config scoring better on the subset is still predicted to pass."""
    from dabuild.progress import Progress
    from dabuild.tune.scorer import Scorer
    from dabuild.tune.search import Budget, Search
    from dabuild.tune.trials import TrialStore

    evaluator, graph = spread_mlp(tmp_path)
    space = build_space(graph, C_FALLBACK)
    rows = evaluator.subset(300)
    configs = [space.default(), *(space.with_node(space.default(), name, choice) for name, node in space.nodes.items()
                                  for choice in node.candidates)]
    optimistic = next(c for c in configs
                      if evaluator.subset_metric(c, rows) > evaluator.score(c).metric)  # the subset flatters it
    sub, full = evaluator.subset_metric(optimistic, rows), evaluator.score(optimistic).metric
    assert evaluator.baseline == evaluator.subset_baseline(rows) == 1.0  # labels are the float model's argmax
    search = Search(space, evaluator, Scorer(evaluator), TrialStore(None, "x"), Goal("relative", 1 - (sub + full) / 2),
                    "size", Budget(10), Progress.silent())
    assert search.subset_predicts_pass(optimistic)
    [trial] = search.evaluate([optimistic], "probe")
    assert not trial.passed and search.subset_passes(optimistic) and not search.subset_predicts_pass(optimistic)
    fp32 = QuantConfig({name: FP32 for name in space.nodes})
    assert search.subset_metric(fp32) > sub and search.subset_predicts_pass(fp32)
