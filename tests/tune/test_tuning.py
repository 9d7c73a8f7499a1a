"""Tuning: the space and its narrowing, the driver's budget and goal, trial store resume, parallel trials,
misses, user metrics and the report. Strategies themselves: test_strategies.py.

`tune` runs the real tune stage on the digits MLP (traced and calibrated once per session).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dabuild.capability import CapabilitySpec, load_capability
from dabuild.cli import main
from dabuild.errors import BuildError
from dabuild.ir.graph import Graph
from dabuild.pipeline.plan import tune_stage_of
from dabuild.progress import Progress
from dabuild.quant.defaults import default_config
from dabuild.recipe import Recipe, load_recipe
from dabuild.resources import data_dir
from dabuild.tune.space import FP32, build_space
from dabuild.tune.stage import tune_stage

REPO = Path(__file__).resolve().parents[2]
# The c capability as an integer-only one, and with float islands of any op: what these tests compare.
C = load_capability(data_dir("capabilities") / "c.yaml").model_copy(update={"fp32_fallback": False})
C_FALLBACK = C.model_copy(update={"fp32_fallback": True, "float_ops": None})
STRICT = {"criterion": "absolute", "tolerable_loss": 0.0}  # match fp32 exactly: most configs miss it
ONLY_DEFAULT = {"op_type": {"dense": {"weight": {"algorithm": ["minmax"]}, "activation": {"algorithm": ["minmax"]}}}}


# A continuous metric (a user metric): small config changes move it, so strategies must search.
NLL = '''import numpy as np


def nll(outputs, labels):
    shifted = outputs - outputs.max(axis=1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return float(-log_p[np.arange(len(labels)), labels].mean())


nll.higher_is_better = False
'''
NLL_GOAL = {"criterion": "relative", "tolerable_loss": 0.001}


def nll_recipe_dir(tmp_path: Path) -> Path:
    import shutil

    folder = tmp_path / "digits"
    shutil.copytree(REPO / "recipes" / "digits", folder, dirs_exist_ok=True)
    (folder / "nll.py").write_text(NLL)
    recipe = folder / "recipe.yaml"
    recipe.write_text(recipe.read_text().replace("metric: accuracy", "metric: nll.py:nll"))
    return folder


def digits_recipe(recipe_dir: Path = REPO / "recipes" / "digits", **tuning: object) -> Recipe:
    recipe = load_recipe(recipe_dir / "recipe.yaml")
    data = recipe.tuning.model_dump()
    data.update(tuning)
    recipe.tuning = type(recipe.tuning).model_validate(data)
    return recipe


def tune(stages: tuple[Path, Path], out: Path, recipe: Recipe, capability: CapabilitySpec = C,
         trials: Path | None = None, jobs: int = 1, keep: Path | None = None) -> dict:
    """Run the tune stage into `out`; its metrics plus the history lines."""
    out.mkdir(parents=True)
    journal = out.parent / f"{out.name}.history.jsonl"
    stage = tune_stage_of(recipe, capability)
    tune_stage(stage.config, stage.files, stages[0], stages[1], out, Progress.silent(), trials, jobs, keep, journal)
    metrics = json.loads((out / "metrics.json").read_text())
    metrics["history"] = [json.loads(line) for line in journal.read_text().splitlines()] if journal.exists() else []
    metrics["evaluated"] = sum(not t["cached"] for t in metrics["history"])
    return metrics


# ---------------------------------------------------------------- space


def test_space_is_the_product_of_the_capability_choices(digits_stages: tuple[Path, Path]) -> None:
    graph = Graph.load(digits_stages[0])
    space = build_space(graph, C)
    dense = C.for_op("dense")
    per_node = int(np.prod([len(getattr(choices, field)) for choices in (dense.weight, dense.activation)
                            for field in ("dtype", "scheme", "granularity", "algorithm")]))
    offered = dense.activation.dtype   # int16 among them enters the space on request only (tuning.space)
    per_node = per_node * len([dtype for dtype in offered if dtype != "int16"]) // len(offered)
    assert {name: len(node.candidates) for name, node in space.nodes.items()} == {n.name: per_node for n in graph.nodes}
    assert space.default() == default_config(graph, C)
    assert space.total() == per_node ** len(graph.nodes)
    with_fallback = build_space(graph, C_FALLBACK)
    assert all(node.candidates[-1] == FP32 and len(node.candidates) == per_node + 1
               for node in with_fallback.nodes.values())
    view = with_fallback.capability_view()
    assert set(view["opwise"]) == {(n.name, n.op) for n in graph.nodes}
    assert {"dtype": "fp32"} in [c["weight"] for c in view["optypewise"]["dense"]]


def test_space_costs_count_weight_bits_and_bops(digits_stages: tuple[Path, Path]) -> None:
    graph = Graph.load(digits_stages[0])
    space = build_space(graph, C_FALLBACK)
    weights = sum(graph.constants[n.inputs[1]].size for n in graph.nodes)
    assert space.size(space.default()) == 8 * weights and space.size(space.fp32()) == 32 * weights
    assert space.bops(space.default()) == 64 * weights  # dense: one MAC per weight, 8 x 8 bits
    first = next(iter(space.nodes))
    assert space.size(space.with_node(space.default(), first, FP32)) == 8 * weights + 24 * space.nodes[first].weight_size


def test_narrowing_by_op_type_and_node_name(digits_stages: tuple[Path, Path]) -> None:
    graph = Graph.load(digits_stages[0])
    first, second = graph.nodes[0].name, graph.nodes[1].name
    space = build_space(graph, C_FALLBACK, {
        "op_type": {"dense": {"weight": {"algorithm": ["mse"]}, "activation": {"algorithm": ["minmax", "entropy"]}}},
        "op_name": {first: {"activation": {"algorithm": ["percentile"]}},
                    second: {"weight": {"dtype": ["fp32"]}, "activation": {"dtype": ["fp32"]}}},
    })
    assert {(c.weight.algorithm, c.activation.algorithm) for c in space.nodes[first].candidates[:-1]} == {("mse", "percentile")}
    assert space.nodes[first].candidates[-1] == FP32
    assert space.nodes[second].candidates == (FP32,)
    third = space.nodes[graph.nodes[2].name].candidates
    assert list(dict.fromkeys(c.activation.algorithm for c in third[:-1])) == ["minmax", "entropy"]
    no_fallback = build_space(graph, C_FALLBACK, {"op_type": {"dense": {"weight": {"dtype": ["int8"]}}}})
    assert all(FP32 not in node.candidates for node in no_fallback.nodes.values())


@pytest.mark.parametrize("narrowing, message", [
    ({"op_type": {"dense": {"weight": {"dtype": ["int4"]}}}},
     r"tuning\.space\.op_type\.dense\.weight\.dtype: capability 'c' does not offer 'int4'.*offers: int8"),
    ({"op_type": {"dense": {"activation": {"granularity": ["per_channel"]}}}},
     r"op_type\.dense\.activation\.granularity: capability 'c' does not offer 'per_channel'"),
    ({"op_type": {"conv": {"weight": {"algorithm": ["mse"]}}}}, r"no node of op type 'conv'.*op types: dense"),
    ({"op_name": {"matmul_7": {"weight": {"algorithm": ["mse"]}}}}, r"no node named 'matmul_7'.*did you mean"),
    ({"op_name": {"matmul_0": {"weight": {"dtype": ["fp32"]}}}},
     r"op_name\.matmul_0\.weight\.dtype: capability 'c' does not allow fp32 fallback"),
])
def test_narrowing_the_capability_cannot_honour_is_an_error(digits_stages: tuple[Path, Path], narrowing: dict,
                                                            message: str) -> None:
    with pytest.raises(BuildError, match=message):
        build_space(Graph.load(digits_stages[0]), C, narrowing)


def test_recipe_validates_the_shape_of_a_narrowing(tmp_path: Path) -> None:
    import shutil

    from dabuild.errors import ValidationError

    shutil.copytree(REPO / "recipes" / "digits", tmp_path / "r")
    path = tmp_path / "r" / "recipe.yaml"
    path.write_text(path.read_text().replace(
        "  strategy: basic\n", "  strategy: basic\n  space:\n    op_type:\n      dense: {weight: {scheme: [skew]}}\n"))
    with pytest.raises(ValidationError) as error:
        load_recipe(path)
    assert "tuning.space.op_type.dense.weight.scheme[0]" in str(error.value) and "skew" in str(error.value)


# ---------------------------------------------------------------- driver, store, parallel


def test_doubling_max_trials_re_evaluates_nothing(digits_stages: tuple[Path, Path], tmp_path: Path) -> None:
    trials = tmp_path / "trials"
    recipe = digits_recipe(strategy="exhaustive", accuracy=STRICT, max_trials=6, allow_miss=True)
    first = tune(digits_stages, tmp_path / "a", recipe, C_FALLBACK, trials)
    assert first["trials"] == 6 and first["evaluated"] == 6 and not first["goal_met"]
    recipe = digits_recipe(strategy="exhaustive", accuracy=STRICT, max_trials=12, allow_miss=True)
    second = tune(digits_stages, tmp_path / "b", recipe, C_FALLBACK, trials)
    earlier = {t["config_hash"] for t in first["history"]}
    re_evaluated = [t for t in second["history"] if t["config_hash"] in earlier and not t["cached"]]
    assert re_evaluated == []
    assert [t["config_hash"] for t in second["history"][:6]] == [t["config_hash"] for t in first["history"]]
    assert second["trials"] == 12 and second["evaluated"] == 6


def test_without_a_trial_store_everything_is_evaluated(digits_stages: tuple[Path, Path], tmp_path: Path) -> None:
    recipe = digits_recipe(strategy="exhaustive", accuracy=STRICT, max_trials=3, allow_miss=True)
    tune(digits_stages, tmp_path / "a", recipe, C_FALLBACK)
    again = tune(digits_stages, tmp_path / "b", recipe, C_FALLBACK)
    assert again["evaluated"] == 3


def test_parallel_trials_record_what_serial_trials_do(digits_stages: tuple[Path, Path], tmp_path: Path) -> None:
    recipe = digits_recipe(nll_recipe_dir(tmp_path), strategy="basic", accuracy=NLL_GOAL, max_trials=40)
    serial = tune(digits_stages, tmp_path / "serial", recipe, C_FALLBACK, tmp_path / "t1", jobs=1)
    parallel = tune(digits_stages, tmp_path / "parallel", recipe, C_FALLBACK, tmp_path / "t2", jobs=2)

    def essence(run: dict) -> list[tuple]:
        return [(t["config_hash"], t["metric"], t["passed"], t["step"], t["cached"]) for t in run["history"]]

    assert essence(serial) == essence(parallel) and len(essence(serial)) > 2
    assert serial["config_hash"] == parallel["config_hash"] and serial["goal_met"]
    assert (tmp_path / "serial" / "config.json").read_bytes() == (tmp_path / "parallel" / "config.json").read_bytes()


def test_max_trials_bounds_the_search(digits_stages: tuple[Path, Path], tmp_path: Path) -> None:
    recipe = digits_recipe(strategy="random", accuracy=STRICT, max_trials=4, allow_miss=True, seed=3)
    metrics = tune(digits_stages, tmp_path / "out", recipe, C_FALLBACK)
    assert (len(metrics["history"]) <= 4 and "max_trials (4)" in metrics["stop_reason"]) or metrics["goal_met"]


# ---------------------------------------------------------------- misses and metrics


def test_unsatisfiable_goal_fails_and_keeps_the_best_found(digits_stages: tuple[Path, Path], tmp_path: Path) -> None:
    recipe = digits_recipe(strategy="basic", accuracy=STRICT, space=ONLY_DEFAULT)  # one config, below fp32
    with pytest.raises(BuildError, match=r"no config meets the goal.*best found: 0\.9689.*kept in .*keep") as error:
        tune(digits_stages, tmp_path / "out", recipe, C, keep=tmp_path / "keep")
    assert "tuning.allow_miss" in str(error.value)
    assert (tmp_path / "keep" / "config.json").is_file() and (tmp_path / "keep" / "report" / "report.md").is_file()


def test_allow_miss_accepts_the_best_found(digits_stages: tuple[Path, Path], tmp_path: Path) -> None:
    recipe = digits_recipe(strategy="sensitivity", accuracy=STRICT, space=ONLY_DEFAULT, allow_miss=True)
    metrics = tune(digits_stages, tmp_path / "out", recipe, C)
    assert not metrics["goal_met"] and metrics["trials"] == 1 and (tmp_path / "out" / "qgraph").is_dir()
    assert "**missed**" in (tmp_path / "out" / "report" / "report.md").read_text()


def _user_metric_recipe(folder: Path, body: str, allow_miss: bool = False) -> Path:
    """The `digits` fixture's recipe (its c target only: a core install builds it) scored by score.py:top2."""
    (folder / "score.py").write_text(body)
    recipe = folder / "recipe.yaml"
    text = recipe.read_text().replace("metric: accuracy", "metric: score.py:top2")
    if allow_miss:
        text = text.replace("  strategy: basic\n", "  strategy: basic\n  allow_miss: true\n")
    recipe.write_text(text)
    return folder


def test_user_metric_function_scores_the_trials(digits: Path, tmp_path: Path, cache_dir: Path) -> None:
    folder = _user_metric_recipe(digits, (
        "import numpy as np\n\n"
        "def top2(outputs, labels):\n"
        "    best = np.argsort(outputs, axis=1)[:, -2:]\n"
        "    return float(np.mean((best == labels[:, None]).any(axis=1)))\n"))
    assert main(["build", str(folder), "--build-dir", str(tmp_path / "build"), "-q"]) == 0
    metrics = json.loads((tmp_path / "build" / "digits-mlp" / "tune-c" / "metrics.json").read_text())
    assert metrics["metric"] == "score.py:top2" and metrics["fp32"] > 0.98 and metrics["goal_met"]


def test_metric_function_that_raises_is_a_build_error_naming_it(digits: Path, tmp_path: Path, cache_dir: Path,
                                                              capsys: pytest.CaptureFixture) -> None:
    folder = _user_metric_recipe(digits, "def top2(outputs, labels):\n    raise ValueError('no top-2 today')\n")
    assert main(["build", str(folder), "--build-dir", str(tmp_path / "build"), "-q"]) == 1
    err = capsys.readouterr().err
    assert "metric 'score.py:top2' raised ValueError: no top-2 today" in err
    assert not (tmp_path / "build" / "digits-mlp" / "tune-c").exists()


def test_metric_that_is_not_a_function_form_is_a_validation_error(digits: Path) -> None:
    folder = _user_metric_recipe(digits, "")
    recipe = folder / "recipe.yaml"
    recipe.write_text(recipe.read_text().replace("score.py:top2", "missing.py:top2"))
    assert main(["validate", str(folder)]) == 2


# ---------------------------------------------------------------- exit codes, report


def test_timeout_stops_the_search_and_keeps_the_best_so_far(digits_stages: tuple[Path, Path],
                                                            tmp_path: Path) -> None:
    import shutil

    # a metric no config can meet: each call scores lower than the float baseline, scored first, and takes
    # 20 ms, so 1000 trials need 20 s and only the 3 s clock can stop the search, however fast the machine
    folder = tmp_path / "digits"
    shutil.copytree(REPO / "recipes" / "digits", folder)
    (folder / "declining.py").write_text(
        "import itertools\nimport time\n_calls = itertools.count()\n\n\ndef score(outputs, labels):\n"
        "    time.sleep(0.02)\n    return -float(next(_calls))\n")
    recipe_file = folder / "recipe.yaml"
    recipe_file.write_text(recipe_file.read_text().replace("metric: accuracy", "metric: declining.py:score"))
    recipe = digits_recipe(folder, strategy="exhaustive", accuracy=STRICT, max_trials=1000, timeout=3,
                           allow_miss=True)
    metrics = tune(digits_stages, tmp_path / "t", recipe, C)
    assert metrics["stop_reason"] == "timeout (3 s) reached in phase exhaustive"
    assert 1 <= metrics["trials"] < 1000 and metrics["history"]
    assert metrics["quantized"] == max(t["metric"] for t in metrics["history"]) and not metrics["goal_met"]


def test_a_timeout_shorter_than_the_setup_still_scores_the_first_trial(digits_stages: tuple[Path, Path],
                                                                      tmp_path: Path) -> None:
    """However long the baseline and the space took (a loaded machine), a build with a timeout has a result."""
    recipe = digits_recipe(strategy="exhaustive", accuracy=STRICT, max_trials=1000, timeout=1e-6, allow_miss=True)
    metrics = tune(digits_stages, tmp_path / "t", recipe, C)
    assert metrics["trials"] >= 1 and metrics["stop_reason"].startswith("timeout (1e-06 s) reached")


def test_cli_miss_exits_1_and_allow_miss_exits_0(digits: Path, tmp_path: Path, cache_dir: Path,
                                                 capsys: pytest.CaptureFixture) -> None:
    folder = digits
    recipe = folder / "recipe.yaml"
    recipe.write_text(recipe.read_text().replace(
        "{criterion: relative, tolerable_loss: 0.01}",
        "{criterion: absolute, tolerable_loss: 0.0}\n  space: {op_type: {dense: "
        "{weight: {algorithm: [minmax]}, activation: {algorithm: [minmax]}}}}"))
    build = ["build", str(folder), "--build-dir", str(tmp_path / "build"), "-q"]
    assert main(build) == 1
    assert "no config meets the goal" in capsys.readouterr().err
    assert (tmp_path / "build" / "digits-mlp" / "debug" / "tune-c" / "config.json").is_file()
    recipe.write_text(recipe.read_text().replace("  strategy: basic\n", "  strategy: basic\n  allow_miss: true\n"))
    assert main(build) == 0
    assert "goal MISSED" in capsys.readouterr().out


def test_report_has_the_per_node_table_and_plots(tmp_path: Path, cache_dir: Path, digits: Path,
                                                 capsys: pytest.CaptureFixture) -> None:
    folder = digits  # its C target alone: one capability, one report
    assert main(["build", str(folder), "--build-dir", str(tmp_path / "build"), "-q"]) == 0
    report = tmp_path / "build" / "digits-mlp" / "tune-c" / "report"
    markdown = (report / "report.md").read_text()
    html = (report / "report.html").read_text()
    graph = Graph.load(tmp_path / "build" / "digits-mlp" / "trace")
    assert "| node | op | precision | weight bits | sensitivity (output MSE) |" in markdown
    for node in graph.nodes:
        assert f"| {node.name} | dense | w:int8/" in markdown and f"<td>{node.name}</td>" in html
    assert "**met**" in markdown and "<strong>met</strong>" in html
    data = json.loads((report / "report.json").read_text())  # what the build's page draws its pictures from
    assert [node["name"] for node in data["nodes"]] == [node.name for node in graph.nodes]
    assert len(data["trials"]) == json.loads((report.parent / "metrics.json").read_text())["trials"]
    capsys.readouterr()
    assert main(["report", str(folder), "--build-dir", str(tmp_path / "build")]) == 0
    assert capsys.readouterr().out.strip() == markdown.strip()


def test_report_before_any_build_is_a_usage_error(digits: Path, tmp_path: Path) -> None:
    assert main(["report", str(digits), "--build-dir", str(tmp_path / "none")]) == 2


def test_metric_scores_are_what_the_integer_reference_delivers(digits_stages: tuple[Path, Path],
                                                               tmp_path: Path) -> None:
    """The chosen trial's score is the accuracy of the saved qgraph run through the integer reference."""
    from dabuild.qir.qgraph import QGraph
    from dabuild.qir.reference import run_quantized

    metrics = tune(digits_stages, tmp_path / "out", digits_recipe())
    data = np.load(REPO / "recipes" / "digits" / "data.npz")
    qgraph = QGraph.load(tmp_path / "out" / "qgraph")
    accuracy = float(np.mean(run_quantized(qgraph, data["x_test"].astype(np.float32)).argmax(1) == data["y_test"]))
    assert metrics["quantized"] == accuracy and metrics["goal_met"]


def test_a_terminal_sees_trial_n_of_n_the_best_so_far_and_the_time_left(
        digits_stages: tuple[Path, Path], tmp_path: Path) -> None:
    import io

    recipe = digits_recipe(max_trials=5)
    stage = tune_stage_of(recipe, C)
    terminal = io.StringIO()
    out = tmp_path / "tune"
    out.mkdir()
    tune_stage(stage.config, stage.files, digits_stages[0], digits_stages[1], out, Progress(terminal, live=True))
    lines = [line for line in terminal.getvalue().split("\r\x1b[K") if line.startswith("  tune: trial")]
    assert lines[0].startswith("  tune: trial 1 of at most 5, ") and "s left" in lines[0]
    assert any("best accuracy 0." in line for line in lines)
    logged = io.StringIO()  # not a terminal: no progress lines in the log
    tune_stage(stage.config, stage.files, digits_stages[0], digits_stages[1], tmp_path, Progress(logged, live=False))
    assert "tune: trial" not in logged.getvalue()


def test_a_hopeless_trial_stops_early_with_a_bound_that_already_misses(digits_stages: tuple[Path, Path]) -> None:
    """Scored batch by batch against the least passing accuracy: stopped once even all-right remaining samples
    could not reach it, with a bound at least the full score; a config that passes scores as without a floor."""
    from dabuild.data import load_inputs, load_labels
    from dabuild.quant.defaults import default_config
    from dabuild.tune.evaluate import EvalSetup, Evaluator

    recipe = digits_recipe()
    spec = recipe.data.evaluation
    x = load_inputs(spec, ["x"])["x"]
    evaluator = Evaluator(EvalSetup(digits_stages[0], digits_stages[1], x, load_labels(spec),
                                    "accuracy", 50))
    config = default_config(evaluator.graph, C)
    full = evaluator.score(config)
    assert evaluator.score(config, floor=full.metric).metric == full.metric  # it passes: scored to the end
    early = evaluator.score(config, floor=full.metric + 0.01)
    assert early.stopped and full.metric <= early.metric < full.metric + 0.01
    assert not evaluator.score(config, floor=0.0).stopped


def test_the_traced_default_config_is_the_float_baseline_and_its_first_trial(digits_stages: tuple[Path, Path],
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """One traced pass over every row (the report's per-node errors) gives the float outputs the batched pass
    gives, bit for bit, and the config's integer outputs: its score then runs no integer graph, and is the
    score running it gives, stopped early or not."""
    from dabuild.data import load_inputs, load_labels
    from dabuild.tune import evaluate
    from dabuild.tune.evaluate import EvalSetup, Evaluator

    spec = digits_recipe().data.evaluation
    setup = EvalSetup(digits_stages[0], digits_stages[1], load_inputs(spec, ["x"])["x"], load_labels(spec),
                      "accuracy", 50)
    batched, traced = Evaluator(setup), Evaluator(setup)
    config = default_config(traced.graph, C)
    errors = traced.trace(config).errors
    assert np.array_equal(traced.float_outputs, batched.float_outputs) and traced.baseline == batched.baseline
    integer_runs: list[int] = []
    real_run = evaluate.run_quantized
    monkeypatch.setattr(evaluate, "run_quantized", lambda qgraph, x: integer_runs.append(len(x)) or real_run(qgraph, x))
    full = batched.score(config)
    floors = (None, full.metric, full.metric + 0.01)  # scored to the end twice, then stopped early
    ran = [batched.score(config, floor) for floor in floors]
    runs = len(integer_runs)
    scored = [traced.score(config, floor) for floor in floors]
    assert len(integer_runs) == runs  # the traced evaluator ran no integer graph
    assert [(s.metric, s.mse, s.stopped) for s in scored] == [(s.metric, s.mse, s.stopped) for s in ran]
    assert ran[-1].stopped and all(s.seconds > 0 for s in scored)
    assert errors == traced.node_errors(config) == batched.node_errors(config)


def test_a_tune_stage_runs_the_float_graph_once_over_the_evaluation_data(digits_stages: tuple[Path, Path],
                                                                          tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The float baseline, the report's per-node errors and the default config's trial share one pass of each
    graph: the float graph sees each evaluation row once in the whole stage, and the metrics and report are
    those of the baseline's own batched pass."""
    from dabuild.ir.interpreter import Interpreter

    recipe = digits_recipe(nll_recipe_dir(tmp_path), strategy="basic", accuracy=NLL_GOAL, max_trials=12)
    rows: list[int] = []
    real_run = Interpreter.run
    monkeypatch.setattr(Interpreter, "run", lambda self, feeds, *args, **kwargs:
                        rows.append(len(next(iter(feeds.values())))) or real_run(self, feeds, *args, **kwargs))
    metrics = tune(digits_stages, tmp_path / "out", recipe, C_FALLBACK)
    assert sum(rows) == len(np.load(REPO / "recipes" / "digits" / "data.npz")["x_test"])
    assert metrics["trials"] > 2 and metrics["history"][0]["step"] == "default" and not metrics["history"][0]["cached"]


def test_relative_mse_of_arrays_laid_out_alike_is_the_two_conversions_bits() -> None:
    """relative_mse squares float32 arrays laid out alike (channels last under NCHW axes, as both runs leave a
    node's output) in one pass each; the bits are those of converting both to float64 first."""
    from dabuild.tune.evaluate import relative_mse

    rng = np.random.default_rng(2)
    reference = rng.standard_normal((8, 28, 28, 96), np.float32).transpose(0, 3, 1, 2)
    values = np.empty_like(reference)
    values[...] = reference + np.float32(0.01) * rng.standard_normal(reference.shape, np.float32)
    converted = reference.astype(np.float64)
    expected = float(np.mean((values.astype(np.float64) - converted) ** 2)) / float(np.mean(converted**2))
    assert relative_mse(values, reference).hex() == expected.hex()
    assert relative_mse(np.ascontiguousarray(values), reference) == pytest.approx(expected, rel=1e-12)


def _worker_batch_size(_: object) -> int:
    from dabuild.tune import scorer

    assert scorer._worker is not None
    return scorer._worker.batch_size


def test_trial_workers_split_the_evaluators_memory(digits_stages: tuple[Path, Path]) -> None:
    """-j N: each of the N trial workers sizes its batches to its share of the evaluator's memory, so together
    they stay within it; where fewer fit, the stage starts fewer (workers_that_fit)."""
    from dabuild.data import load_inputs, load_labels
    from dabuild.ir.memory import sample_bytes, workers_that_fit
    from dabuild.tune.evaluate import EvalSetup, Evaluator
    from dabuild.tune.scorer import Scorer

    spec = digits_recipe().data.evaluation
    x = load_inputs(spec, ["x"])["x"]
    graph = Graph.load(digits_stages[0])
    weights = sum(array.nbytes for array in graph.constants.values())
    budget = 2 * weights + x.nbytes + 200 * sample_bytes(graph)  # room for 200 samples in one process
    evaluator = Evaluator(EvalSetup(digits_stages[0], digits_stages[1], x, load_labels(spec), "accuracy", 512,
                                    budget=budget))
    assert evaluator.batch_size == 200
    with Scorer(evaluator, 2) as scorer:
        config = default_config(evaluator.graph, C)
        assert [s.metric for s in scorer.score([config, config])] == [evaluator.score(config).metric] * 2
        assert scorer._pool is not None
        sizes = set(scorer._pool.map(_worker_batch_size, range(4)))
    assert sizes == {evaluator.samples_within(budget // 2)} and max(sizes) < 200
    need = 2 * weights + x.nbytes + sample_bytes(graph)  # one worker: the weights twice, the data, a sample
    assert [workers_that_fit(graph, 8, k * need - 1, x.nbytes) for k in (1, 2, 3, 9)] == [1, 1, 2, 8]
    assert [workers_that_fit(graph, 8, k * need, x.nbytes) for k in (1, 3)] == [1, 3]
