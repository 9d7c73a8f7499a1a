"""The `tune` stage: search the capability's space for the cheapest config that meets the accuracy goal.

It scores the float graph once, builds the tuning space, lets the recipe's
strategy propose configs (each scored through dabuild's integer reference,
remembered in the trial store), then writes the chosen config, its quantized
graph, the trial history, the metrics the build summary prints, and the
report: all of it a function of the stage's inputs, so the stage caches
soundly. What depends on this run (time per trial, which scores came from the
trial store) goes to the `journal`, an append-only history outside the stage's
outputs. When no config meets the goal, the build fails (exit 1) after keeping
the best-found config, its history and report in `keep_dir`, unless
`tuning.allow_miss` accepts it.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from dabuild.errors import BuildError
from dabuild.progress import Progress

if TYPE_CHECKING:
    from collections.abc import Callable

    from dabuild.qir.qgraph import QGraph
    from dabuild.quant.config import QuantConfig
    from dabuild.trust import TeamKey
    from dabuild.tune.trials import SharedTrials


T = TypeVar("T")


def tune_stage(
    config: dict[str, Any],
    files: dict[str, Path],
    graph_dir: Path,
    stats_dir: Path,
    out_dir: Path,
    progress: Progress,
    trials_root: Path | None = None,
    jobs: int = 1,
    keep_dir: Path | None = None,
    journal: Path | None = None,
    constraints: Sequence[Callable[[QGraph], str | None]] = (),
    stored_bytes: Callable[[QGraph], int] | None = None,
    cluster: str | None = None,
    shared_trials: SharedTrials | None = None,
    trials_key: TeamKey | None = None,
    memory_shares: int = 1,
) -> None:
    """Tune into `out_dir` from the stage's keyed inputs alone: `config` is the tune `Stage.config` (tuning,
    capability, metric, evaluation data settings), `files` its declared files (`evaluation`, and `metric` for a
    file metric). `trials_root` holds the trial store (None: remember nothing), its records signed with
    `trials_key` where others may write it.

    Every trial is appended to `journal` (a JSON line each) when one is given. `constraints` are the budgets
    of the targets built from this tuning: each says why a quantized graph's artifact would not fit (None:
    it fits), and a config that does not fit is never chosen. `stored_bytes` is the
    target's measure of its artifact (`Target.stored_bytes`), which objective `size` minimises (None: weight bits).
    `memory_shares` is how many stages may run at once, each within its share of the memory budget; the
    `jobs` trial workers split the stage's share, and fewer start where fewer fit.
    """
    from dabuild.capability import CapabilitySpec
    from dabuild.data import DataFile, load_inputs, required_labels
    from dabuild.ir.graph import Graph
    from dabuild.ir.memory import workers_that_fit
    from dabuild.limits import memory_budget
    from dabuild.plugins import STRATEGIES, load
    from dabuild.quant.calibrate import STATS_FILE
    from dabuild.quant.given_params import carries_quantization
    from dabuild.recipe import TuningSpec
    from dabuild.tune.evaluate import EvalSetup, Evaluator
    from dabuild.tune.objective import make_objective
    from dabuild.tune.report import REPORT_DIR, write_report
    from dabuild.tune.scorer import Scorer
    from dabuild.tune.search import Budget, Goal, Search
    from dabuild.tune.space import build_space, integer_writers
    from dabuild.tune.trials import TrialStore, context_hash

    started = time.monotonic()
    tuning = TuningSpec.model_validate(config["tuning"])
    capability = CapabilitySpec.model_validate(config["capability"])
    spec = DataFile.from_config(config["evaluation"], files["evaluation"])
    graph_dir, stats_dir, out_dir = Path(graph_dir), Path(stats_dir), Path(out_dir)
    graph = Graph.load(graph_dir)
    x = next(iter(load_inputs(spec, [t.name for t in graph.inputs], graph.integer_inputs(),
                              graph.stored_inputs()).values()))
    labels = required_labels(spec)
    writers = integer_writers(graph, capability)
    share = memory_budget() // max(1, memory_shares)
    evaluator = Evaluator(EvalSetup(graph_dir, stats_dir, x, labels, config["metric"], spec.batch_size,
                                    tuning.bias_correction, files.get("metric"), integer_writers=writers,
                                    budget=share))
    space = build_space(graph, capability, tuning.space.model_dump(mode="json", exclude_none=True))
    store = TrialStore(trials_root, context_hash(graph, stats_dir / STATS_FILE, x, labels,
                                                 evaluator.metric.identity(), tuning.bias_correction, writers),
                       shared_trials, trials_key)
    strategy_name = tuning.strategy or ("given" if carries_quantization(graph) else "basic")
    strategy = load(STRATEGIES, strategy_name)()
    where = f"tune:{capability.name}"
    workers = jobs if cluster is not None else workers_that_fit(graph, jobs, share, x.nbytes)
    if workers < jobs:
        progress.info(f"{where}: {workers} of {jobs} trial workers fit its share of the memory budget "
                      f"({share / 1e9:.2f} GB)")
    stored_bytes = stored_bytes and _naming(where, stored_bytes)
    constraints = [_naming(where, constraint) for constraint in constraints]
    objective = make_objective(tuning.objective, space, capability, evaluator.priced, stored_bytes)
    goal = Goal(tuning.accuracy.criterion, tuning.accuracy.tolerable_loss)
    progress.debug(f"{where}: {space.total()} configs in the space, strategy {strategy_name}, "
                   f"objective {objective.name} ({objective.unit})")
    # The report's per-node errors of the default config over every row, made first: their float pass is the
    # baseline's and their integer pass the default config's trial (Evaluator.trace), each run once.
    set_up = time.monotonic()
    evaluator.trace(space.default())
    traced = time.monotonic()
    if journal is not None:
        journal.parent.mkdir(parents=True, exist_ok=True)
    with open(journal or os.devnull, "a") as history, Scorer(evaluator, workers, cluster) as scorer:
        def fits(config: QuantConfig) -> str | None:
            qgraph = evaluator.priced(config)
            return next((why for why in (constraint(qgraph) for constraint in constraints) if why), None)

        search = Search(space, evaluator, scorer, store, goal, objective,
                        Budget(tuning.max_trials, tuning.timeout), progress, tuning.seed, history,
                        fits if constraints else None)
        chosen = search.run(strategy)
    stored = sum(t.cached for t in search.trials)
    progress.info(f"{where}: {len(search.trials)} trials ({len(search.trials) - stored} evaluated, "
                  f"{stored} from the trial store)")
    progress.info(f"{where}: search {search.seconds:.1f} s, of which pricing {len(search.priced)} configs "
                  f"({objective.name}) {search.pricing_seconds:.1f} s")
    if chosen is None:
        raise BuildError(f"{where}: no trial was evaluated ({search.stop_reason})")
    metric = evaluator.metric
    threshold = goal.threshold(evaluator.baseline, metric.higher_is_better)
    written = time.monotonic()
    evaluator.quantize(chosen.config).save(out_dir / "qgraph")
    chosen.config.save(out_dir / "config.json")
    write_report(out_dir / REPORT_DIR, f"Tuning report: capability {capability.name}",
                 search, chosen, threshold)
    progress.info(f"{where}: set up {set_up - started:.1f} s, traced the default config {traced - set_up:.1f} s "
                  f"(float baseline, per-node errors, its trial's outputs), wrote the chosen graph and report "
                  f"{time.monotonic() - written:.1f} s")
    fp32_size = space.size(space.fp32())
    metrics: dict[str, Any] = {
        "metric": metric.name,
        "fp32": evaluator.baseline,
        "quantized": chosen.metric,
        "threshold": threshold,
        "precision": _precision(chosen.config),
        "goal_met": chosen.passed,
        "strategy": strategy_name,
        "given": carries_quantization(graph),  # the baseline ("fp32") is the float run of the model's quantization
        "objective": objective.name,
        "cost": chosen.cost,
        "cost_unit": objective.unit,
        "trials": len(search.trials),
        "chosen_trial": chosen.index,
        "config_hash": chosen.config_hash,
        "size_bits": chosen.size,
        **({"size_bytes": chosen.cost} if objective.unit == "bytes" else {}),
        "size_ratio": chosen.size / fp32_size if fp32_size else 1.0,
        "bops": chosen.bops,
        "stop_reason": search.stop_reason,
        "subset_evaluations": search.subset_evaluations,
    }
    if not chosen.passed:
        metrics["most_harmful"] = search.harmful_nodes()
    (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    if chosen.passed:
        return
    if search.misfits:
        smallest = min((t for t in search.trials if t.config_hash in search.misfits), key=lambda t: t.cost)
        raise BuildError(f"{where}: no config that meets the accuracy goal fits the targets' budgets; the smallest "
                         f"artifact found (trial {smallest.index}, {objective.name} {smallest.cost} {objective.unit}): "
                         f"{search.misfits[smallest.config_hash]}")
    message = (f"{where}: no config meets the goal: {metric.name} must be "
               f"{'>=' if metric.higher_is_better else '<='} {threshold:.4f} (fp32 {evaluator.baseline:.4f}, "
               f"{goal.criterion} loss {goal.tolerable_loss:g}); best found: {chosen.metric:.4f} after "
               f"{len(search.trials)} trials ({search.stop_reason}); most harmful nodes: "
               f"{', '.join(metrics['most_harmful'])}")
    if tuning.allow_miss:
        progress.info(f"{message}; kept, as tuning.allow_miss is set")
        return
    if keep_dir is not None:
        shutil.rmtree(keep_dir, ignore_errors=True)
        shutil.copytree(out_dir, keep_dir)
        message += f"; the best-found config and its report are kept in {keep_dir}"
    raise BuildError(message + "; set tuning.allow_miss: true to accept it, or relax tuning.accuracy")


def _naming(where: str, measure: Callable[[QGraph], T]) -> Callable[[QGraph], T]:
    """`measure` (a target's export, to size or fit an artifact), its failure named as this stage's: the target
    refused a config the space offered, or its tools failed on the artifact."""
    def named(qgraph: QGraph) -> T:
        try:
            return measure(qgraph)
        except BuildError as error:
            raise BuildError(f"{where}: the target could not build a trial's artifact: {error}") from None
    return named


def _precision(config: QuantConfig) -> str:
    """What the chosen config uses, e.g. `w int4+int8, a int8, 1 node fp32`."""
    weights = sorted({n.weight.dtype for n in config.nodes.values() if n.weight is not None})
    activations = sorted({n.activation.dtype for n in config.nodes.values() if n.activation is not None})
    parts = [f"w {'+'.join(weights)}"] if weights else []
    parts += [f"a {'+'.join(activations)}"] if activations else []
    fallback = sum(n.fp32 for n in config.nodes.values())
    return ", ".join(parts + ([f"{fallback} node{'s' * (fallback > 1)} fp32"] if fallback else []))
