"""Adapters from a `StageRun` to the stage functions of trace/, quant/, tune/ and targets/.

Each adapter reads its inputs' folders, calls the library function, and writes
into `run.out_dir`. They see the recipe only through the build's `Recipe` object;
everything they read is also declared in the stage's plan (see plan.py), which is
what keeps the cache sound.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dabuild.pipeline.execute import StageFunction, StageRun

if TYPE_CHECKING:
    from dabuild.capability import CapabilitySpec
    from dabuild.recipe import Recipe


def stage_functions(recipe: "Recipe", capabilities: dict[str, "CapabilitySpec"], jobs: int = 1,
                    trials_root: Path | None = None) -> dict[str, StageFunction]:
    """The function run for each stage kind of this recipe's build.

    `jobs` processes score tuning trials; `trials_root` is the run cache's trial
    store (None with --no-cache: tuning then remembers nothing between runs).
    """

    def trace(run: StageRun) -> None:
        from dabuild.ir.graph import Graph
        from dabuild.trace.base import trace_stage

        hooked = [_target(recipe, t.name) for t in recipe.targets if t.kind in run.stage.config["hooks"]]
        for target in hooked:
            target.pre_trace(recipe.model)
        trace_stage(recipe.model, recipe.base_dir, run.out_dir, run.progress)
        if hooked:
            graph = Graph.load(run.out_dir)
            for target in hooked:
                target.post_trace(graph)

    def calibrate(run: StageRun) -> None:
        from dabuild.data import batches, load_inputs
        from dabuild.ir.graph import Graph
        from dabuild.quant.calibrate import calibrate as calibrate_graph

        graph = Graph.load(run.inputs["graph"])
        spec = recipe.data.calibration
        arrays = load_inputs(spec, recipe.base_dir, [t.name for t in graph.inputs])
        stats = calibrate_graph(graph, batches(arrays, spec.batch_size), run.progress)
        stats.save(run.out_dir)

    def tune(run: StageRun) -> None:
        from dabuild.tune.stage import tune_stage

        capability = capabilities[run.stage.name.split(":", 1)[1]]
        stored_by = run.stage.config["stored_by"]
        tune_stage(recipe, capability, run.inputs["graph"], run.inputs["stats"], run.out_dir, run.progress,
                   trials_root=trials_root, jobs=jobs, keep_dir=run.build_dir / "debug" / run.stage.dirname,
                   journal=run.build_dir / "history" / f"{run.stage.dirname}.jsonl",
                   stored_bytes=_target(recipe, stored_by).stored_bytes if stored_by else None)

    def export(run: StageRun) -> None:
        from dabuild.quant.qgraph import QGraph

        target = _target(recipe, run.stage.target)
        target.export(QGraph.load(run.inputs["qgraph"] / "qgraph"), run.out_dir)
        target.post_export(run.out_dir)

    def check(run: StageRun) -> None:
        from dabuild.data import load_inputs, load_labels
        from dabuild.quant.qgraph import QGraph
        from dabuild.targets.check import check_stage
        from dabuild.tune.metric import load_metric

        target = _target(recipe, run.stage.target)
        qgraph = QGraph.load(run.inputs["qgraph"] / "qgraph")
        spec = recipe.data.evaluation
        samples = run.stage.config["samples"]
        arrays = load_inputs(spec, recipe.base_dir, qgraph.input_names)
        x = next(iter(arrays.values()))
        labels = load_labels(spec, recipe.base_dir)
        if samples is not None:
            x, labels = x[:samples], labels[:samples]
        metric = load_metric(run.stage.config["metric"], recipe.base_dir)
        check_stage(
            target,
            qgraph,
            run.inputs["artifact"],
            x,
            run.stage.config["tolerance"],
            run.out_dir,
            run.build_dir / "debug" / run.stage.dirname,
            run.progress,
            lambda outputs: metric(outputs, labels),
        )

    return {"trace": trace, "calibrate": calibrate, "tune": tune, "export": export, "check": check}


def _target(recipe: "Recipe", name: str | None):  # noqa: ANN202 - returns the plugin's Target subclass
    from dabuild.plugins import TARGETS, load

    spec = next(t for t in recipe.targets if t.name == name)
    target_class = load(TARGETS, spec.kind)
    return target_class(target_class.Options.model_validate(spec.options))
