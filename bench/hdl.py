"""HDL benchmark on recipes/jet-mlp: dabuild against da4ml written by hand, and tuned widths against uniform 8-bit.

The jet-mlp recipe (16 -> 64 -> 32 -> 32 -> 5, relu) is traced, calibrated and
tuned through the real tune stage (its recipe: mixed-precision over capability
da4ml, objective `estimate`, 2 % relative accuracy goal); the tune time is printed.

(a) The tuned QGraph through dabuild (da4ml's `trace_model` with the `dabuild`
    tracer plugin, what the hdl target exports) against the same network
    written directly with da4ml's tracing API from the quantized integer
    weights and fixed-point types, as a da4ml user would write it (input
    quantization, constant matmul, rounding half away from zero, saturation,
    relu as a clamp): both cost estimates and latencies, whether they are equal
    (target: equal), and whether the two programs compute the same outputs.
(b) The tuned config against uniform int8 (scheme pot, the capability's
    default ranges) at the same accuracy goal: da4ml's cost of each (full
    trace), accuracies, and the ratio (target <= 0.8). The tuner's per-layer
    estimate is printed next to each full-trace cost, with how long each takes.

Usage: python bench/hdl.py
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np
from da4ml.trace import FixedVariableArray, FixedVariableArrayInput, HWConfig, comb_trace
from da4ml.types import CombLogic

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests"))
from test_tuning import tune  # noqa: E402
from timing import fastest  # noqa: E402
from tuning import prepare  # noqa: E402  (bench/ is not a package)

from dabuild.capability import discover_capabilities  # noqa: E402
from dabuild.data import load_inputs, load_labels  # noqa: E402
from dabuild.qir.qgraph import QGraph, QuantParams  # noqa: E402
from dabuild.quant.config import QuantConfig  # noqa: E402
from dabuild.recipe import load_recipe  # noqa: E402
from dabuild.targets.hdl.cost import Da4mlCost  # noqa: E402
from dabuild.targets.hdl.program import trace  # noqa: E402
from dabuild.tune.evaluate import EvalSetup, Evaluator  # noqa: E402
from dabuild.tune.search import Goal  # noqa: E402
from dabuild.tune.space import TuningSpace, build_space  # noqa: E402
from dabuild.tune.trials import describe_config  # noqa: E402

# ---------------------------------------------------------------- da4ml by hand (nothing from dabuild.targets.hdl)


def fixed(params: QuantParams, signed: bool = True) -> tuple[int, int, int]:
    """(sign bit, integer bits, fractional bits) of a tensor whose scale is 2**-f."""
    f = -int(np.log2(params.scale))
    bits = int(params.qmax - params.qmin).bit_length()
    return int(signed), bits - int(signed) - f, f


def round_half_away(accumulator: FixedVariableArray, lsb: np.ndarray, step: float) -> FixedVariableArray:
    """da4ml rounds half up (RND); half away from zero differs on negative ties only: pull negatives down by one
    accumulator LSB first, where the accumulator is finer than the output step."""
    values = [v.msb_mux(v - float(d), v) if d < step else v
              for v, d in zip(np.ravel(accumulator._vars), np.ravel(lsb))]
    return FixedVariableArray(np.array(values, dtype=object).reshape(accumulator.shape), hwconf=accumulator.hwconf)


def dense_by_hand(x: FixedVariableArray, weight: np.ndarray, weight_scale: np.ndarray, bias: np.ndarray,
                  x_step: float, out: QuantParams, low: int, high: int) -> FixedVariableArray:
    """y = clamp(round_half_away((x @ W + b) / s_out), low, high) * s_out, in real units."""
    lsb = np.broadcast_to(x_step * weight_scale, (weight.shape[1],))
    accumulator = x @ (weight * weight_scale) + bias * lsb
    signed = low < 0
    if signed and np.any(lsb < out.scale):
        accumulator = round_half_away(accumulator, lsb, out.scale)
    k, i, f = fixed(out, signed)
    y = accumulator.quantize(k, i, f, overflow_mode="SAT", round_mode="RND")
    if (low, high) == ((-(2 ** (i + f)) if k else 0), 2 ** (i + f) - 1):
        return y
    values = [v.max_of(low * out.scale).min_of(high * out.scale) for v in np.ravel(y._vars)]
    return FixedVariableArray(np.array(values, dtype=object).reshape(y.shape), hwconf=y.hwconf)


def mlp_by_hand(qgraph: QGraph, hwconf: HWConfig) -> CombLogic:
    """The tuned MLP written directly with da4ml, from its integer weights and fixed-point types."""
    inputs = FixedVariableArrayInput(qgraph.tensors[qgraph.input].shape, hwconf=hwconf)
    x = inputs.quantize(*fixed(qgraph.input_params, qgraph.input_params.qmin < 0))  # uint inputs: no sign bit
    for layer in qgraph.layers:
        x_params = qgraph.tensors[layer.inputs[0]].params
        x = dense_by_hand(x, layer.weight.astype(np.float64), np.asarray(layer.weight_scale, dtype=np.float64),
                          layer.bias.astype(np.float64), x_params.scale, qgraph.tensors[layer.outputs[0]].params,
                          layer.output_min, layer.output_max)
    return comb_trace(inputs, x)


# ---------------------------------------------------------------- helpers


def uniform(space: TuningSpace, dtype: str) -> QuantConfig:
    """The default config with every weight and activation dtype set to `dtype`."""
    nodes = {}
    for name, node in space.nodes.items():
        choice = node.default
        for role in ("weight", "activation"):
            if getattr(choice, role) is not None:
                choice = dataclasses.replace(choice, **{role: dataclasses.replace(getattr(choice, role), dtype=dtype)})
        assert choice in node.candidates, f"{name}: {choice} is not in the space"
        nodes[name] = choice
    return QuantConfig(nodes)


def timed(call):
    start = time.perf_counter()
    result = call()
    return result, time.perf_counter() - start


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="dabuild-bench-hdl-"))
    folder, stages = prepare(root, "jet-mlp")
    recipe = load_recipe(folder / "recipe.yaml")
    capability = discover_capabilities()["da4ml"]
    options = recipe.targets[0].options
    hwconf = HWConfig(options["adder_size"], options["carry_size"], options["latency_cutoff"])

    metrics, tune_seconds = timed(lambda: tune(stages, root / "tune", recipe, capability))
    tuned = QGraph.load(root / "tune" / "qgraph")
    config = QuantConfig.load(root / "tune" / "config.json")
    print(f"jet-mlp tuned by {metrics['strategy']} (objective {metrics['objective']}, {metrics['cost_unit']}): "
          f"{metrics['trials']} trials in {tune_seconds:.1f} s; {metrics['precision']}")
    for name, text in describe_config(config).items():
        print(f"  {name:10s} {text}")

    print("\n(a) the tuned network through dabuild vs. written directly with da4ml")
    ours, ours_seconds = timed(lambda: trace(tuned, hwconf))
    theirs, theirs_seconds = timed(lambda: mlp_by_hand(tuned, hwconf))
    x = np.random.default_rng(0).normal(0, 2, (2000, tuned.tensors[tuned.input].shape[0]))
    x = np.round(x / tuned.input_params.scale) * tuned.input_params.scale
    same_outputs = np.array_equal(ours.predict(x), theirs.predict(x))
    print(f"  dabuild (trace_model, plugin 'dabuild')  cost {ours.cost:9.1f} LUTs  latency {ours.latency[1]:5.1f}  "
          f"({ours_seconds:.1f} s)")
    print(f"  da4ml directly                           cost {theirs.cost:9.1f} LUTs  latency {theirs.latency[1]:5.1f}  "
          f"({theirs_seconds:.1f} s)")
    equal = ours.cost == theirs.cost and tuple(ours.latency) == tuple(theirs.latency)
    print(f"  equal cost and latency: {'yes' if equal else 'NO'}   same outputs on 2000 inputs: "
          f"{'yes' if same_outputs else 'NO'}")

    print("\n(b) tuned widths vs. uniform int8 (pot) at the same goal")
    data = recipe.data.evaluation
    labels = load_labels(data)
    graph_inputs = tuned.input_names
    x_eval = next(iter(load_inputs(data, graph_inputs).values()))
    evaluator = Evaluator(EvalSetup(*stages, x_eval, labels, recipe.data.metric, data.batch_size))
    goal = Goal(recipe.tuning.accuracy.criterion, recipe.tuning.accuracy.tolerable_loss)
    threshold = goal.threshold(evaluator.baseline, evaluator.metric.higher_is_better)
    space = build_space(evaluator.graph, capability)
    print(f"  float accuracy {evaluator.baseline:.4f}; goal: >= {threshold:.4f} ({goal.criterion} loss "
          f"{goal.tolerable_loss:g})")
    costs = {}
    for label, chosen in (("uniform int8", uniform(space, "int8")), ("tuned", config)):
        qgraph = evaluator.quantize(chosen)
        score = evaluator.score(chosen).metric
        full, full_seconds = timed(lambda qgraph=qgraph: trace(qgraph, hwconf).cost)
        model = Da4mlCost()
        estimate, estimate_seconds = timed(partial(model, qgraph))
        cached = fastest(partial(model, qgraph), 0.5)
        costs[label] = full
        print(f"  {label:12s} accuracy {score:.4f} ({'meets' if score >= threshold else 'MISSES'} the goal)  "
              f"cost {full:9.1f} LUTs (full trace, {full_seconds:.1f} s)  estimate {estimate:9.1f} "
              f"({estimate / full - 1:+.1%}; {estimate_seconds:.1f} s cold, {cached * 1e3:.1f} ms cached)")
    ratio = costs["tuned"] / costs["uniform int8"]
    print(f"  tuned / uniform int8 cost: {ratio:.3f}  (target <= 0.8: {'met' if ratio <= 0.8 else 'MISSED'})")


if __name__ == "__main__":
    main()
