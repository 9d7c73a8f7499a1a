"""A recipe becomes a list of stages: plain data saying what each stage reads.

A `Stage` names its kind, the part of the recipe it reads (`config`), the stages
whose outputs it consumes (`inputs`, by role), the user files it reads, and the
external packages and tools whose versions matter. That is exactly what goes
into its cache key (see `key_parts`), and nothing else may influence its outputs.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dabuild import __version__
from dabuild.pipeline.code_digest import stage_code_digest
from dabuild.pipeline.hashing import canonical_json, hash_file, hash_value

if TYPE_CHECKING:
    from dabuild.capability import CapabilitySpec
    from dabuild.pipeline.manifest import Manifest
    from dabuild.recipe import Recipe, ResolvedTarget, TargetSpec


@dataclass(frozen=True)
class Stage:
    name: str                              # task name: trace, calibrate, tune:<capability>, export:<target>, check:<target>
    kind: str                              # trace, calibrate, tune, export or check
    config: dict[str, Any]                 # the recipe part it reads, canonical JSON-able
    inputs: dict[str, str] = field(default_factory=dict)   # role -> upstream stage name
    input_folders: dict[str, str] = field(default_factory=dict)  # role -> the one subfolder of that input it reads
    files: dict[str, Path] = field(default_factory=dict)   # role -> user file read by the stage
    packages: tuple[str, ...] = ()         # external packages whose versions enter the key
    tools: Callable[[], dict[str, str]] | None = None      # versions of external programs (compilers, simulators)
    programs: Callable[[], list[Path]] | None = None        # those programs' files, which the no-op fast path watches
    target: str | None = None              # the recipe target an export/check stage belongs to
    plugins: tuple[str, ...] = ()          # modules of the plugins it runs, whose code enters its key
    # The target plugins it runs, by role ("target"; "hooks"; "budgets" and "stored_by" of tune), made from the
    # recipe's resolved targets: their kind, options and capability are in `config`, their code in `plugins`.
    runs: dict[str, Any] = field(default_factory=dict)

    @property
    def dirname(self) -> str:
        return self.name.replace(":", "-")

    @property
    def static_parts(self) -> dict[str, Any]:
        """The key parts known without touching any file: what doit's `config_changed` watches."""
        return {
            "stage": self.kind,
            "code": stage_code_digest(self.kind, self.plugins),
            "dabuild": __version__,
            "config": self.config,
        }


def watched_parts(stage: Stage) -> dict[str, Any]:
    """The key parts that are not files: doit's `config_changed` compares them, so an upgraded
    package or compiler reruns the stage even when no file changed."""
    from dabuild.installed import installed_version

    return {
        **stage.static_parts,
        "packages": {name: installed_version(name) for name in stage.packages},
        "tools": stage.tools() if stage.tools else {},
    }


def input_digests(stage: Stage, manifests: dict[str, Manifest]) -> dict[str, str]:
    """The identity of what the stage reads of each input (by role): the whole upstream output, or only the
    subfolder `input_folders` names. Early cutoff, as Bazel and Shake have it: export keys on the tune stage's
    `qgraph/` alone, so a tune that ran again and chose the same graph (its report and metrics changed) leaves
    every export and check up to date."""
    return {role: manifest.digest_of(stage.input_folders.get(role)) for role, manifest in manifests.items()}


def key_parts(stage: Stage, input_digests: dict[str, str]) -> dict[str, Any]:
    """Everything the stage's outputs depend on; the cache key is its hash."""
    return {
        **watched_parts(stage),
        "inputs": dict(sorted(input_digests.items())),
        "files": {role: hash_file(path) for role, path in sorted(stage.files.items())},
    }


def cache_key(parts: dict[str, Any]) -> str:
    return hash_value(parts)


def plan(recipe: Recipe, targets: list[str] | None = None) -> list[Stage]:
    """The stages that build `targets` (all recipe targets when None), in dependency order."""
    model = recipe.model
    hooks = _trace_hooks(recipe)
    source_file = _source_file(recipe)
    model_files = {"source": source_file} if source_file else {}
    if model.weights:
        model_files["weights"] = model.weights
    for index, extra in enumerate(model.depends):
        model_files[f"depends{index}"] = extra
    model_files.update(_side_files(recipe))
    hooks = _trace_hooks(recipe)
    stages = [
        Stage(
            "trace",
            "trace",
            {
                "framework": model.framework,
                "entry": _source_entry(recipe),
                "inputs": None if model.inputs is None else {  # a shape, or {shape, dtype} of an integer input
                    name: entry if isinstance(entry, list) else entry.model_dump() for name, entry in model.inputs.items()},
                "hooks": [{"kind": hook.target_class.kind, "options": hook.options.model_dump(mode="json")}
                          for hook in hooks],
            },
            files=model_files,
            packages=_framework_packages(recipe),
            plugins=_tracer_modules(recipe) + tuple(_target_module(hook.target_class.kind) for hook in hooks),
            runs={"hooks": [hook.target() for hook in hooks]},
        ),
        Stage(
            "calibrate",
            "calibrate",
            # per-channel histograms serve bias correction's channel means alone: kept only when it is on
            {**_data_config(recipe.data.calibration), "per_channel": recipe.tuning.bias_correction},
            inputs={"graph": "trace"},
            files={"data": recipe.data.calibration.source},
            packages=("numpy",),
            tools=_interpreter_tools,
            programs=_interpreter_programs,
        ),
    ]
    chosen = [t for t in recipe.targets if targets is None or t.name in targets]
    tuned: set[str] = set()
    for target in chosen:
        capability = _capability_name(target)
        if capability not in tuned:
            tuned.add(capability)
            stages.append(tune_stage_of(recipe, recipe.known_capabilities[capability], target))
        stages.extend(_target_stages(recipe, target, capability))
    return stages


def _side_files(recipe: Recipe) -> dict[str, Path]:
    """The files tracing reads besides those the recipe names, as the frontend finds them in the model itself:
    ONNX external data, the modules a model's .py file imports from its folder. Each enters the trace key by
    content under its name relative to the model, so changing one traces again (a stale build otherwise)."""
    from dabuild.trace.base import python_imports

    model_file = _source_file(recipe)
    if model_file is None:
        return {}
    if model_file.suffix == ".py":
        found = python_imports(model_file)
    else:
        from dabuild.plugins import TRACERS, load

        framework = _framework(recipe)
        found = load(TRACERS, framework).side_files(model_file) if framework else []
    return {f"side:{path.relative_to(model_file.parent).as_posix()}": path for path in found
            if path.is_file() and path.resolve().is_relative_to(model_file.parent.resolve())}


def _trace_hooks(recipe: Recipe) -> list[ResolvedTarget]:
    """The targets (one per kind and options) whose `pre_trace`/`post_trace` hooks run in the trace stage.

    Their kind and options enter the trace key, so a recipe with a hooked target never reuses a trace
    made without its hooks; the built-in targets have none, so their recipes share traces (the ops a
    target cannot take are refused right after trace by `Target.refuse`, which changes nothing).
    """
    from dabuild.targets.base import Target

    hooked: dict[str, ResolvedTarget] = {}
    for resolved in recipe.resolved.values():
        cls = resolved.target_class
        if cls.pre_trace is not Target.pre_trace or cls.post_trace is not Target.post_trace:
            key = canonical_json({"kind": cls.kind, "options": resolved.options.model_dump(mode="json")})
            hooked.setdefault(key, resolved)
    return [hooked[key] for key in sorted(hooked)]


def tune_stage_of(recipe: Recipe, capability: CapabilitySpec, target: TargetSpec | None = None) -> Stage:
    """The tune stage for one capability: its config (tuning, capability, metric, data settings) and files.

    `target`, the first recipe target built for the capability, measures the artifact size objective `size`
    minimises (its kind, size options and packages enter the key); without one, `size` counts weight bits."""
    stored_by = recipe.resolved[target.name] if target is not None else None
    target_class = stored_by.target_class if stored_by is not None else None
    evaluation = recipe.data.evaluation
    files = {"evaluation": evaluation.source, **_metric_file(recipe)}
    # Targets of this capability with a budget (c's flash/RAM): tuning never chooses a config that overflows one.
    budgeted = {canonical_json({"kind": t.kind, "options": t.options}): recipe.resolved[t.name].target()
                for t in recipe.targets if _capability_name(t) == capability.name and (t.options or {}).get("budget")}
    budgets = [json.loads(key) for key in sorted(budgeted)]
    budget_targets = [budgeted[key] for key in sorted(budgeted)]
    return Stage(
        f"tune:{capability.name}",
        "tune",
        {
            "tuning": recipe.tuning.model_dump(mode="json"),
            "capability": _as_targets_run_it(recipe, capability).model_dump(mode="json", exclude={"description"}),
            "metric": recipe.data.metric,
            "evaluation": _data_config(evaluation),
            **({"budgets": budgets} if budgets else {}),
            "stored_by_target": None if target is None or target_class is None else {"kind": target.kind, "options": {
                key: value for key, value in target.options.items() if key in target_class.size_options}},
        },
        inputs={"graph": "trace", "stats": "calibrate"},
        files=files,
        packages=("numpy", *(("optuna",) if recipe.tuning.strategy == "bayesian" else ()),
                  *_cost_model_packages(recipe, capability), *(target_class.packages if target_class else ())),
        tools=lambda: {**_interpreter_tools(), **_budget_tools(budget_targets)},
        programs=lambda: [*_interpreter_programs(), *_budget_programs(budget_targets)],
        plugins=tuple(sorted({*_cost_model_modules(recipe, capability),
                              *(_target_module(budget["kind"]) for budget in budgets),
                              *((_target_module(target.kind),) if target is not None else ())})),
        runs={"budgets": budget_targets, **({"stored_by": stored_by.target()} if stored_by else {})},
    )


def _as_targets_run_it(recipe: Recipe, capability: CapabilitySpec) -> CapabilitySpec:
    """The capability the search reads: as each target built for it narrows it with its options
    (`Target.capability_for`: float islands only of the ops it writes in float, none on a core without an FPU,
    7-bit weights first where onnxruntime's u8s8 kernels saturate), so tuning never picks a config a target
    refuses or runs inexactly."""
    for target in recipe.targets:
        if _capability_name(target) == capability.name:
            capability = recipe.resolved[target.name].target_class.capability_for(capability, target.options or {})
    return capability


def _budget_tools(budgeted: list[Any]) -> dict[str, str]:
    """The tools a budgeted target measures its artifact with (the cross compiler): tuning asks it whether each
    config fits, so a new one may change the choice."""
    return {tool: version for target in budgeted for tool, version in target.export_tools().items()}


def _budget_programs(budgeted: list[Any]) -> list[Path]:
    return [path for target in budgeted for path in target.export_programs()]


def _metric_file(recipe: Recipe) -> dict[str, Path]:
    """The user's metric file, if the metric is one (`file.py:function`): tune and check read it."""
    source = recipe.data.metric.rpartition(":")[0]
    return {"metric": recipe.base_dir / source} if source.endswith(".py") else {}


def _interpreter_tools() -> dict[str, str]:
    """How the interpreter runs convs here (compiled kernels and their compiler, or numpy): calibration and
    tuning observe its outputs, whose float summation order that choice decides."""
    from dabuild.ir.kernels.native import native_backend

    return {"interpreter": native_backend()}


def _interpreter_programs() -> list[Path]:
    """The C compiler that builds the interpreter's kernels, if any: upgrading it must rerun those stages."""
    from dabuild.ir.kernels.native import compiler_path

    path = compiler_path()
    return [path] if path else []


def _target_module(kind: str) -> str:
    from dabuild.plugins import TARGETS, module_of

    return module_of(TARGETS, kind)


def _tracer_modules(recipe: Recipe) -> tuple[str, ...]:
    """The frontend that traces the model (every installed one when only running the model can tell)."""
    from dabuild.plugins import TRACERS, available, module_of

    framework = _framework(recipe)
    names = [framework] if framework in available(TRACERS) else available(TRACERS)
    return tuple(sorted(module_of(TRACERS, name) for name in names))


def _cost_model_modules(recipe: Recipe, capability: CapabilitySpec) -> tuple[str, ...]:
    """The cost model the search minimises, when its objective is the capability's estimate."""
    from dabuild.capability import COST_MODELS
    from dabuild.plugins import available, module_of
    from dabuild.tune.objective import ESTIMATE, resolve_objective

    name = capability.cost_model
    if name is None or resolve_objective(recipe.tuning.objective, capability) != ESTIMATE:
        return ()
    return (module_of(COST_MODELS, name),) if name in available(COST_MODELS) else ()


def _cost_model_packages(recipe: Recipe, capability: CapabilitySpec) -> tuple[str, ...]:
    """The packages of the cost model the search minimises, when its objective is the capability's estimate."""
    from dabuild.capability import COST_MODELS
    from dabuild.plugins import load
    from dabuild.tune.objective import ESTIMATE, resolve_objective

    if capability.cost_model is None or resolve_objective(recipe.tuning.objective, capability) != ESTIMATE:
        return ()
    try:
        return tuple(load(COST_MODELS, capability.cost_model).packages)
    except ImportError:  # not installed: the tune stage fails and says which package to install
        return ()


def _target_stages(recipe: Recipe, target: TargetSpec, capability: str) -> list[Stage]:
    resolved = recipe.resolved[target.name]
    target_class, plugin = resolved.target_class, resolved.target()
    options = target.options
    evaluation = recipe.data.evaluation
    tolerance = target.check_io.tolerance or target_class.default_tolerance
    runs = resolved.capability.model_dump(mode="json", exclude={"description"})  # what its refusals read

    export = Stage(
        f"export:{target.name}",
        "export",
        {"kind": target.kind, "options": options, "capability": runs},
        inputs={"qgraph": f"tune:{capability}"},
        input_folders={"qgraph": "qgraph"},
        packages=target_class.packages,
        tools=plugin.export_tools,
        programs=plugin.export_programs,
        target=target.name,
        plugins=(_target_module(target.kind),),
        runs={"target": plugin},
    )
    check = Stage(
        f"check:{target.name}",
        "check",
        {
            "kind": target.kind,
            "options": options,
            "capability": runs,
            "tolerance": tolerance,
            "samples": target.check_io.samples,
            "evaluation": _data_config(evaluation),
            "metric": recipe.data.metric,
        },
        inputs={"qgraph": f"tune:{capability}", "artifact": export.name, "graph": "trace"},
        input_folders={"qgraph": "qgraph"},
        files={"evaluation": evaluation.source, **_metric_file(recipe)},
        packages=("numpy", *target_class.packages),
        tools=plugin.runtime_version,
        programs=plugin.programs,
        target=target.name,
        plugins=(_target_module(target.kind),),
        runs={"target": plugin},
    )
    return [export, check]


def _capability_name(target: TargetSpec) -> str:
    """The capability the target is tuned for (load_recipe filled it in: the recipe's, or its kind's own)."""
    assert target.capability is not None, "a recipe from load_recipe names every target's capability"
    return target.capability


def _data_config(spec: Any) -> dict[str, Any]:
    """The data part of a key: which arrays and how many, never where the file lives."""
    return spec.model_dump(mode="json", exclude={"source"})


def _split_source(recipe: Recipe) -> tuple[str, str | None]:
    source = recipe.model.source
    path, _, attr = source.rpartition(":") if ":" in source else (source, "", None)
    return path, attr


def _source_file(recipe: Recipe) -> Path | None:
    """The user file holding the model, when the source names one (not an importable package)."""
    path, _ = _split_source(recipe)
    candidate = recipe.base_dir / path
    return candidate if candidate.is_file() else None


def _source_entry(recipe: Recipe) -> str:
    """What is called inside the source: the attribute, or the module path for package sources.

    Files are keyed by content, not by path, so two recipes sharing a model share `trace`.
    """
    if _source_file(recipe) is None:
        return recipe.model.source
    return _split_source(recipe)[1] or ""


def _framework_packages(recipe: Recipe) -> tuple[str, ...]:
    """The packages of the framework that traces the model, whose versions enter the trace key.

    Without `model.framework`, a model file's suffix chooses the framework, exactly
    as tracing will (so `source: model.onnx` still keys on the onnx version).
    """
    return {"onnx": ("onnx",), "torch": ("torch",), "keras": ("keras", "torch", "hgq2")}.get(_framework(recipe) or "", ())


def _framework(recipe: Recipe) -> str | None:
    """The framework that traces the model: the recipe's, else the one its model file's suffix chooses
    exactly as tracing will (None when only the loaded model can tell)."""
    framework = recipe.model.framework
    model_file = _source_file(recipe)
    if framework is None and model_file is not None and ":" not in recipe.model.source:
        from dabuild.errors import UsageError
        from dabuild.trace.base import choose_framework

        try:
            framework = choose_framework(model_file)
        except UsageError:  # no frontend reads it: tracing reports that
            framework = None
    return framework
