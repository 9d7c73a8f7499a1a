"""The `tune` stage: pick a quantization config for one capability and prove its accuracy.

It evaluates the float graph once, lets the recipe's strategy search configs
(each evaluated on the evaluation data through dabuild's integer reference),
then writes the chosen config, the quantized graph, the trial history and the
metrics that the build summary prints.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from dabuild.progress import Progress

if TYPE_CHECKING:
    from dabuild.capability import CapabilitySpec
    from dabuild.recipe import AccuracyGoal, Recipe

LOWER_IS_BETTER = frozenset({"mse"})


def meets_goal(metric: str, baseline: float, value: float, goal: "AccuracyGoal") -> bool:
    """Is `value` within the tolerable loss of the float `baseline`?"""
    allowed = goal.tolerable_loss * (abs(baseline) if goal.criterion == "relative" else 1.0)
    if metric in LOWER_IS_BETTER:
        return value <= baseline + allowed
    return value >= baseline - allowed


def tune_stage(
    recipe: "Recipe",
    capability: "CapabilitySpec",
    graph_dir: Path,
    stats_dir: Path,
    out_dir: Path,
    progress: Progress,
) -> None:
    from dabuild.data import batches, evaluate_metric, load_inputs, load_labels
    from dabuild.ir import interpreter
    from dabuild.ir.graph import Graph
    from dabuild.plugins import STRATEGIES, load
    from dabuild.quant.calibrate import Stats
    from dabuild.quant.quantize import quantize
    from dabuild.quant.reference import dequantize_output, quantize_input, run_integer

    graph = Graph.load(graph_dir)
    stats = Stats.load(stats_dir)
    spec = recipe.data.evaluation
    arrays = load_inputs(spec, recipe.base_dir, [t.name for t in graph.inputs])
    labels = load_labels(spec, recipe.base_dir)
    metric = recipe.data.metric
    output = graph.outputs[0]

    def float_outputs() -> np.ndarray:
        parts = [interpreter.run(graph, batch)[output] for batch in batches(arrays, spec.batch_size)]
        return np.concatenate(parts)

    def evaluate(qgraph) -> float:  # noqa: ANN001 - a QGraph
        x = next(iter(arrays.values()))
        return evaluate_metric(metric, dequantize_output(qgraph, run_integer(qgraph, quantize_input(qgraph, x))), labels)

    baseline = evaluate_metric(metric, float_outputs(), labels)
    strategy = load(STRATEGIES, recipe.tuning.strategy)()
    config, trials = strategy.tune(graph, stats, capability, evaluate)
    qgraph = quantize(graph, stats, config)
    quantized = evaluate(qgraph)
    goal_met = meets_goal(metric, baseline, quantized, recipe.tuning.accuracy)
    if not goal_met:
        progress.info(
            f"tune:{capability.name}: {metric} {quantized:.4f} misses the goal "
            f"({recipe.tuning.accuracy.criterion} loss {recipe.tuning.accuracy.tolerable_loss} of {baseline:.4f})"
        )
    qgraph.save(out_dir / "qgraph")
    config.save(out_dir / "config.json")
    with open(out_dir / "history.jsonl", "w") as history:
        for trial in trials:
            history.write(json.dumps(trial, sort_keys=True) + "\n")
    metrics = {
        "metric": metric,
        "fp32": baseline,
        "quantized": quantized,
        "precision": "+".join(capability.precisions),
        "goal_met": goal_met,
        "trials": len(trials),
    }
    (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
