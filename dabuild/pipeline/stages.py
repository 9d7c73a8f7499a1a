"""Adapters from a `StageRun` to the stage functions of trace/, quant/, tune/ and targets/.

Each adapter reads exactly what the stage's cache key holds: `run.stage.config`
(its part of the recipe, canonical JSON), `run.stage.files` (the user files it
declares, by role), its input stages' folders, and `run.stage.runs`, the
target plugins made from what its config names (kind, options, capability);
it writes into `run.out_dir`.
No adapter sees the `Recipe`, the recipe's folder or the working directory, so an
output can depend on nothing the key leaves out (tests/pipeline/test_stage_keys.py builds
a recipe twice with everything unkeyed changed and compares the outputs byte for byte).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # types only: execute runs these adapters, plan keys them by their code (code_digest)
    from dabuild.pipeline.execute import StageFunction, StageRun
    from dabuild.trust import TeamKey
    from dabuild.tune.trials import SharedTrials


def stage_functions(jobs: int = 1, trials_root: Path | None = None, cluster: str | None = None,
                    shared_trials: SharedTrials | None = None,
                    trials_key: TeamKey | None = None, memory_shares: int = 1) -> dict[str, StageFunction]:
    """The function run for each stage kind.

    `jobs` processes score tuning trials, or the workers of the Dask cluster at
    `cluster` (a scheduler address); `trials_root` is the run cache's trial
    store (None with --no-cache: tuning then remembers nothing between runs), its
    records signed with `trials_key` where others may write the run cache.
    `shared_trials` is the team's remote, which shares scored trials between machines. `memory_shares` tune
    stages may run at once (threads of this process), each within that share of the memory budget.
    None of them changes what a stage writes.
    """

    def tune(run: StageRun) -> None:
        from dabuild.tune.stage import tune_stage

        constraints = [budgeted.fits for budgeted in run.stage.runs.get("budgets", [])]
        stored_by = run.stage.runs.get("stored_by")  # the target whose artifact size `size` counts
        tune_stage(run.stage.config, run.stage.files, run.inputs["graph"], run.inputs["stats"], run.out_dir,
                   run.progress, trials_root=trials_root, jobs=jobs, cluster=cluster,
                   shared_trials=shared_trials, trials_key=trials_key,
                   keep_dir=run.build_dir / "debug" / run.stage.dirname,
                   journal=run.build_dir / "history" / f"{run.stage.dirname}.jsonl", constraints=constraints,
                   stored_bytes=stored_by.stored_bytes if stored_by else None, memory_shares=memory_shares)

    return {"trace": trace, "calibrate": calibrate, "tune": tune, "export": export, "check": check}


@dataclass(frozen=True)
class ModelInput:
    """The model as the trace stage sees it (the recipe's ModelSpec has the same attributes).

    `source` is `<declared file>:<entry>`, the declared model file, or `package.module:attr`.
    """

    framework: str | None
    source: str
    weights: Path | None
    inputs: dict[str, list[int | None] | dict[str, Any]] | None  # a shape, or {shape, dtype} (trace.base)


def model_input(config: dict[str, Any], files: dict[str, Path]) -> ModelInput:
    source_file, entry = files.get("source"), config["entry"]
    if source_file is None:
        source = entry
    else:
        source = f"{source_file}:{entry}" if entry else str(source_file)
    return ModelInput(config["framework"], source, files.get("weights"), config["inputs"])


def trace(run: StageRun) -> None:
    from dabuild.ir.graph import Graph
    from dabuild.trace.base import trace_stage

    model = model_input(run.stage.config, run.stage.files)
    hooked = run.stage.runs.get("hooks", [])
    for target in hooked:
        target.pre_trace(model)
    trace_stage(model, run.out_dir, run.progress)
    if hooked:
        graph = Graph.load(run.out_dir)
        for target in hooked:
            target.post_trace(graph)


def calibrate(run: StageRun) -> None:
    from dabuild.data import DataFile, batches, load_inputs, rows_in_file
    from dabuild.ir.graph import Graph
    from dabuild.quant.calibrate import calibrate as calibrate_graph

    graph = Graph.load(run.inputs["graph"])
    spec = DataFile.from_config(run.stage.config, run.stage.files["data"])
    arrays = load_inputs(spec, [t.name for t in graph.inputs], graph.integer_inputs(), graph.stored_inputs())
    used, stored = len(next(iter(arrays.values()))), rows_in_file(spec)
    if used < stored:
        run.progress.info(f"calibrate: the first {used:,} of the {stored:,} samples in {spec.source.name} "
                          "(data.calibration.samples)")
    elif used > 10_000:
        run.progress.info(f"calibrate: all {used:,} samples in {spec.source.name}; data.calibration.samples "
                          "takes fewer (a few thousand fix the ranges)")
    stats = calibrate_graph(graph, batches(arrays, spec.batch_size), run.progress, used,
                            per_channel=run.stage.config["per_channel"])
    stats.save(run.out_dir)


def export(run: StageRun) -> None:
    from dabuild.qir.qgraph import QGraph

    target = run.stage.runs["target"]
    target.export(target.integer_graph(QGraph.load(run.inputs["qgraph"] / "qgraph")), run.out_dir)
    target.post_export(run.out_dir)


def check(run: StageRun) -> None:
    from dabuild.data import DataFile, load_inputs, required_labels
    from dabuild.ir.graph import Graph
    from dabuild.qir.qgraph import QGraph
    from dabuild.targets.check import check_stage
    from dabuild.tune.metric import load_metric

    config = run.stage.config
    target = run.stage.runs["target"]
    qgraph = target.integer_graph(QGraph.load(run.inputs["qgraph"] / "qgraph"))
    spec = DataFile.from_config(config["evaluation"], run.stage.files["evaluation"])
    stored = Graph.load(run.inputs["graph"]).stored_inputs()
    x = next(iter(load_inputs(spec, qgraph.input_names, qgraph.input_names if qgraph.takes_indices else (),
                              stored).values()))
    labels = required_labels(spec)
    if config["samples"] != "all":
        x, labels = x[: config["samples"]], labels[: config["samples"]]
    metric = load_metric(config["metric"], run.stage.files.get("metric"))
    check_stage(target, qgraph, run.inputs["artifact"], x, config["tolerance"], run.out_dir,
                run.build_dir / "debug" / run.stage.dirname, run.progress, lambda outputs: metric(outputs, labels))

