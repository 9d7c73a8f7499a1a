"""Mixed precision: int4 weights in the integer path, and the `mixed-precision` strategy on the digits CNN.

int4 weights are symmetric integers in [-7, 7] (inside int4's [-8, 7]) stored one per int8 byte, so
the integer reference and the C kernels run them unchanged; int4 activations are int8 storage clamped
to [-8, 7] (the C capability does not offer them, the integer reference runs them).
The digits-cnn recipe (torch) is traced and calibrated once per session; tuning runs the real tune
stage with bench/capabilities/mixed.yaml (int8 or int4 weights).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from test_lowering import graph_of, lower, with_weights
from test_quantize import C_CAPABILITY
from test_tuning import digits_recipe, tune

from dabuild.capability import load_capability
from dabuild.cli import main
from dabuild.errors import BuildError
from dabuild.ir import Graph, Node
from dabuild.ir.interpreter import run
from dabuild.qir.qgraph import QGraph
from dabuild.qir.reference import dequantize_output, quantize_input, run_integer
from dabuild.quant.config import NodeConfig, QuantChoice, QuantConfig
from dabuild.quant.defaults import default_config
from dabuild.tune.evaluate import EvalSetup, Evaluator
from dabuild.tune.space import TuningSpace, build_space

RNG = np.random.default_rng(0)  # its own: a generator shared with another module makes results depend on order
REPO = Path(__file__).resolve().parents[2]
MIXED = load_capability(REPO / "bench" / "capabilities" / "mixed.yaml")
PER_TENSOR_WEIGHTS = {"op_type": {op: {"weight": {"granularity": ["per_tensor"]}} for op in ("conv", "dense")}}

INT4_CAPABILITY = C_CAPABILITY.model_copy(deep=True, update={"fp32_fallback": False})  # integer widths only
INT4_CAPABILITY.ops["dense"].weight.dtype = ["int8", "int4"]


def dense_graph() -> Graph:
    return graph_of([Node("fc", "dense", ["x", "w", "b"], ["y"], {})], (24,),
                    {"w": RNG.normal(size=(24, 6)), "b": RNG.normal(size=6)})


def conv_graph() -> Graph:
    attrs = {"pads": [1, 1, 1, 1], "strides": [1, 1]}
    return graph_of([Node("conv", "conv", ["x", "w", "b"], ["y"], attrs)], (3, 6, 6),
                    {"w": RNG.normal(size=(5, 3, 3, 3)), "b": RNG.normal(size=5)})


def weight_error_bound(graph: Graph, qgraph: QGraph, x_hat: np.ndarray) -> np.ndarray:
    """Per output, the most rounding each weight (by at most half its scale) can move it: the node's own op
    applied to |x| with every weight set to half its channel's scale and no bias."""
    node, layer = graph.nodes[0], qgraph.layers[0]
    channel = [1] * layer.weight.ndim
    channel[1 if node.op == "dense" else 0] = -1
    half_steps = np.ones(layer.weight.shape) * (layer.weight_scale / 2).reshape(channel)
    bound_graph = Graph(graph.inputs, graph.outputs, graph.nodes,
                        {**graph.constants, node.inputs[1]: half_steps.astype(np.float32),
                         node.inputs[2]: np.zeros_like(graph.constants[node.inputs[2]])})
    return run(bound_graph, {"x": np.abs(x_hat)})["y"]


@pytest.mark.parametrize("make_graph", [dense_graph, conv_graph], ids=["dense", "conv"])
@pytest.mark.parametrize("granularity", ["per_tensor", "per_channel"])
def test_int4_weights_are_within_their_rounding_error_of_float(make_graph, granularity: str) -> None:
    graph = make_graph()
    x = RNG.normal(size=(200, *graph.inputs[0].shape[1:])).astype(np.float32)
    qgraph = lower(graph, x, with_weights(default_config(graph, C_CAPABILITY), dtype="int4",
                                          granularity=granularity))
    weight = qgraph.layers[0].weight
    assert weight.dtype == np.int8 and weight.min() >= -8 and weight.max() <= 7
    assert np.abs(weight).max() == 7  # the peak magnitude lands on the top level
    assert len(np.unique(weight)) <= 15

    x_q = quantize_input(qgraph, x)
    x_hat = qgraph.input_params.dequantize(x_q)
    output = qgraph.output_params
    low, high = output.dequantize(np.array([output.qmin, output.qmax]))
    expected = np.clip(run(graph, {"x": x_hat})["y"], low, high)  # float weights, clipped to what int8 holds
    got = dequantize_output(qgraph, run_integer(qgraph, x_q))
    bound = weight_error_bound(graph, qgraph, x_hat) + output.scale  # + output rounding and fixed point
    assert np.all(np.abs(got - expected) <= bound)
    int8 = lower(graph, x)
    int8_error = np.abs(dequantize_output(int8, run_integer(int8, quantize_input(int8, x))) - expected).mean()
    assert np.abs(got - expected).mean() > 2 * int8_error  # 16 levels instead of 256 do show


def test_int4_activations_lower_and_unknown_dtypes_are_refused_by_name() -> None:
    graph = dense_graph()
    config = default_config(graph, C_CAPABILITY)
    node = config.nodes["fc"]
    x = RNG.normal(size=(50, 24)).astype(np.float32)
    int4_output = QuantConfig({"fc": NodeConfig(node.weight, QuantChoice("int4", "asym", "per_tensor", "minmax"))})
    qgraph = lower(graph, x, int4_output)
    y_q = run_integer(qgraph, quantize_input(qgraph, x))
    assert qgraph.output_params.dtype == "int4" and y_q.dtype == np.int8
    assert y_q.min() == -8 and y_q.max() == 7  # calibrated on these samples: both ends of int4 are reached
    fp16_output = QuantConfig({"fc": NodeConfig(node.weight, QuantChoice("fp16", "asym", "per_tensor", "minmax"))})
    with pytest.raises(BuildError, match=r"graph input 'x'.*dtype 'fp16' \(integer dtypes: int2\.\.int16"):
        lower(graph, x, fp16_output)
    fp16_first = INT4_CAPABILITY.model_copy(deep=True)
    fp16_first.ops["dense"].activation.dtype = ["fp16", "int8"]
    assert default_config(graph, fp16_first).nodes["fc"].activation.dtype == "int8"


def test_space_offers_the_integer_dtypes_dabuild_lowers() -> None:
    """A capability listing int4 and fp16 activations: the space offers int4 activations but no fp16, and a
    recipe asking for fp16 activations is told which key and which dtypes dabuild lowers."""
    both_int4 = INT4_CAPABILITY.model_copy(deep=True)
    both_int4.ops["dense"].activation.dtype = ["int8", "int4", "fp16"]
    graph = dense_graph()
    candidates = build_space(graph, both_int4).nodes["fc"].candidates
    assert {c.activation.dtype for c in candidates} == {"int8", "int4"}
    assert {c.weight.dtype for c in candidates} == {"int8", "int4"}
    assert len(candidates) == 2 * len(build_space(graph, INT4_CAPABILITY).nodes["fc"].candidates)
    asking = {"op_type": {"dense": {"activation": {"dtype": ["fp16"]}}}}
    with pytest.raises(BuildError, match=r"tuning\.space\.op_type\.dense\.activation\.dtype: .* does not offer "
                                         r"'fp16' for activations .*dabuild lowers only int2\.\.int16"):
        build_space(graph, both_int4, asking)


def test_int4_weights_count_four_bits() -> None:
    graph = dense_graph()
    space = build_space(graph, INT4_CAPABILITY)
    assert {c.weight.dtype for c in space.nodes["fc"].candidates} == {"int8", "int4"}
    int4 = QuantConfig({"fc": next(c for c in space.nodes["fc"].candidates if c.weight.dtype == "int4")})
    assert space.size(int4) * 2 == space.size(space.default()) == 8 * graph.constants["w"].size


# ---------------------------------------------------------------- the digits CNN


def uniform_weights(space: TuningSpace, **weight: str) -> QuantConfig:
    """The default config with the fields `weight` (e.g. dtype="int4") replaced in every weight choice."""
    nodes = {}
    for name, node in space.nodes.items():
        choice = node.default
        if choice.weight is not None:
            choice = dataclasses.replace(choice, weight=dataclasses.replace(choice.weight, **weight))
            assert choice in node.candidates, f"{name}: {choice} is not in the space"
        nodes[name] = choice
    return QuantConfig(nodes)


def test_mixed_precision_on_the_digits_cnn_keeps_fp32_accuracy_with_at_most_0_6_of_int8_bits(
        cnn: tuple[Path, tuple[Path, Path]], tmp_path: Path) -> None:
    folder, stages = cnn
    metrics = tune(stages, tmp_path / "tune", digits_recipe(folder, strategy="mixed-precision"), MIXED)
    space = build_space(Graph.load(stages[0]), MIXED)
    int8_bits = space.size(space.default())
    assert metrics["goal_met"] and metrics["fp32"] >= 0.97
    assert metrics["quantized"] >= 0.99 * metrics["fp32"]
    assert metrics["size_bits"] <= 0.6 * int8_bits
    chosen = QuantConfig.load(tmp_path / "tune" / "config.json")
    qgraph = QGraph.load(tmp_path / "tune" / "qgraph")
    for layer in qgraph.layers:
        if layer.op in ("conv", "dense") and chosen.nodes[layer.name].weight.dtype == "int4":
            assert layer.weight.dtype == np.int8 and np.abs(layer.weight).max() <= 7


def test_per_tensor_search_weighs_every_int4_choice_where_uniform_int4_minmax_misses(
        cnn: tuple[Path, tuple[Path, Path]], tmp_path: Path) -> None:
    """Per-tensor weights only: uniform int4 with the default minmax ranges loses several percent, so stepping
    each node to its nearest cheaper choice stalls; weighing every int4 choice (mse ranges too) per node reaches
    <= 0.6x int8 weight bits within the goal, and -j 2 records exactly the trials -j 1 does."""
    folder, stages = cnn
    recipe = digits_recipe(folder, strategy="mixed-precision", space=PER_TENSOR_WEIGHTS)
    metrics = tune(stages, tmp_path / "tune", recipe, MIXED)
    data = np.load(folder / "data.npz")
    evaluator = Evaluator(EvalSetup(*stages, data["x_test"], data["y_test"], "accuracy", 64))
    space = build_space(evaluator.graph, MIXED, PER_TENSOR_WEIGHTS)
    assert evaluator.score(uniform_weights(space, dtype="int4")).metric < 0.99 * evaluator.baseline
    assert metrics["goal_met"] and metrics["quantized"] >= 0.99 * metrics["fp32"]
    assert metrics["size_bits"] <= 0.6 * space.size(space.default())
    chosen = QuantConfig.load(tmp_path / "tune" / "config.json")
    weights = [c.weight for c in chosen.nodes.values() if c.weight is not None]
    assert {w.granularity for w in weights} == {"per_tensor"} and "mse" in {w.algorithm for w in weights}
    history = metrics["history"]
    assert any(not t["passed"] for t in history) and len(history) <= 20  # it searched, on a modest budget
    parallel = tune(stages, tmp_path / "tune-j2", recipe, MIXED, jobs=2)
    assert [(t["config_hash"], t["metric"]) for t in parallel["history"]] == [
        (t["config_hash"], t["metric"]) for t in history]


def build_cnn(tmp_path: Path, edit: Callable[[str], str] = lambda text: text) -> tuple[Path, dict]:
    """Build a private copy of recipes/digits-cnn (its recipe.yaml passed through `edit`); its build dir and
    build.json."""
    pytest.importorskip("torch")
    folder = tmp_path / "digits-cnn"
    shutil.copytree(REPO / "recipes" / "digits-cnn", folder, ignore=shutil.ignore_patterns("build", "__pycache__"))
    shutil.copy(REPO / "bench" / "capabilities" / "mixed.yaml", folder)
    (folder / "recipe.yaml").write_text(edit((folder / "recipe.yaml").read_text()))
    assert main(["build", str(folder), "--build-dir", str(tmp_path / "build"), "-q"]) == 0
    out = tmp_path / "build" / "digits-cnn"
    return out, json.loads((out / "build.json").read_text())


def test_digits_cnn_recipe_builds_end_to_end_and_checks_bit_exact(tmp_path: Path, cache_dir: Path) -> None:
    pytest.importorskip("onnxruntime", reason="the recipe's ort target needs dabuild[onnx]")
    pytest.importorskip("tract", reason="the recipe's tract target needs dabuild[tract]")
    pytest.importorskip("tflite_micro", reason="the recipe's tflm target needs dabuild[tflite]")
    out, summary = build_cnn(tmp_path)
    stages = ("trace", "calibrate", "tune:c", "tune:onnxruntime", "tune:tract", "tune:tflite")
    targets = ("mcu", "ort", "tract", "cortex-m4", "cortex-m55", "tflm")
    stages += tuple(f"{kind}:{target}" for target in targets for kind in ("export", "check"))
    assert summary["outcomes"] == {stage: "executed" for stage in stages}
    assert {name: (check["ok"], check["tolerance"]) for name, check in summary["checks"].items()} == {
        "mcu": (True, "exact"), "ort": (True, "approximate"), "tract": (True, "approximate"),
        "cortex-m4": (True, "exact"), "cortex-m55": (True, "exact"),  # these two in qemu
        "tflm": (True, "exact")}  # in TFLite Micro's interpreter
    metrics = summary["metrics"]["tune:c"]
    assert metrics["fp32"] >= 0.97 and metrics["goal_met"]
    assert [node.op for node in Graph.load(out / "trace").nodes] == [
        "conv", "conv", "max_pool", "conv", "global_avg_pool", "flatten", "dense"]


def with_mixed_capability(recipe: str) -> str:
    """The recipe's C target alone, tuned by mixed-precision under the mixed capability (int8 or int4 weights)."""
    recipe = recipe[: recipe.index("  - name: ort\n")]
    recipe = recipe.replace("tuning:\n  strategy: basic", "capabilities: [mixed.yaml]\ntuning:\n  strategy: mixed-precision")
    return recipe.replace("    kind: c\n", "    kind: c\n    capability: mixed\n")


def test_int4_weights_run_bit_exact_in_the_c_kernels(tmp_path: Path, cache_dir: Path) -> None:
    out, summary = build_cnn(tmp_path, with_mixed_capability)
    assert set(summary["outcomes"]) == {"trace", "calibrate", "tune:mixed", "export:mcu", "check:mcu"}
    assert summary["checks"]["mcu"]["ok"] and summary["checks"]["mcu"]["tolerance"] == "exact"
    chosen = QuantConfig.load(out / "tune-mixed" / "config.json")
    assert "int4" in {c.weight.dtype for c in chosen.nodes.values() if c.weight is not None}
