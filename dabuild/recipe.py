"""The recipe: one YAML file saying which model, which data, how to tune and which targets.

`load_recipe` is the user-facing boundary of dabuild, so it reports every
problem of a recipe at once, each as `recipe.yaml:LINE:COL: message` pointing at
the key or value to edit. Pydantic checks each node (types, ranges, names,
files, the arrays inside .npz files); the loader then checks what spans nodes or
needs plugins: duplicate target names, each target's options (validated by the
target class's own `Options` model) and its capability.

After loading, every path is absolute, and each target's `options`,
`capability` and `check_io.tolerance` are filled in with the target class's
defaults, so later stages (and their cache keys) see the settings in full.
Each target is resolved here, once (`Recipe.resolved`): its plugin class, its
validated options and the capability it runs, which planning hands to the
stages; nothing after this loads a target plugin again.

It runs on every build, even one with nothing to do, so it stays cheap: no
numpy (the .npz check reads only the .npy headers), plugin classes are loaded
only for the target kinds the recipe uses.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    ValidationInfo,
    field_validator,
)
from pydantic import ValidationError as PydanticValidationError

from dabuild import plugins
from dabuild.capability import CapabilitySpec, Slug, collect_capabilities
from dabuild.errors import Diagnostic, UsageError, ValidationError, unknown_name_message
from dabuild.limits import is_numeric, npz_headers
from dabuild.metrics import BUILTIN_METRICS, METRIC_FORMS, top_k_of
from dabuild.userpaths import PathProblem, checked_path
from dabuild.yamlpos import YamlDocument, load_yaml, pydantic_diagnostics, require_mapping, user_error

Tolerance = Literal["exact", "close", "approximate", "very", "super", "ultra"]
# Strict: YAML's `true` is not 1, and `2.0` samples or `"64"` rows mean a mistake, not a number.
PositiveInt = Annotated[int, Field(gt=0, strict=True)]
NonNegativeFloat = Annotated[float, Field(ge=0, strict=True)]
StrictBool = Annotated[bool, Field(strict=True)]


def _base_dir(info: ValidationInfo) -> Path:
    """The folder relative paths start from: the recipe's, passed as validation context."""
    context = info.context or {}
    return Path(context.get("base_dir") or Path.cwd())


def _readable(base_dir: Path, value: Path | str) -> Path | None:
    """A capability file or folder the recipe lists, resolved, or None when it cannot be read."""
    try:
        return checked_path(base_dir / Path(value).expanduser(), folder_ok=True)
    except PathProblem:
        return None


def _user_file(base_dir: Path, value: Path | str, folder_ok: bool = False) -> Path:
    """`value` (relative to `base_dir`) resolved, if it is a regular file (or folder, when `folder_ok`):
    no FIFO, device, symlink loop, over-long name or oversized file gets past validation (userpaths.py)."""
    try:
        return checked_path(Path(base_dir, Path(value).expanduser()), folder_ok, shown=str(value))
    except PathProblem as problem:
        message = str(problem)
        raise user_error(f"file not found: {value}" if message.startswith("file not found") else message) from None


def _existing_path(value: Path, info: ValidationInfo) -> Path:
    return _user_file(_base_dir(info), value)


def _existing_file_or_folder(value: Path, info: ValidationInfo) -> Path:
    return _user_file(_base_dir(info), value, folder_ok=True)


# A file named relative to the recipe's folder; absolute, existing and regular after validation.
ExistingPath = Annotated[Path, AfterValidator(_existing_path)]
ExistingFileOrFolder = Annotated[Path, AfterValidator(_existing_file_or_folder)]


def _plugin_name(group: str):
    """A validator accepting only names registered in the entry-point `group`."""

    def check(name: str | None) -> str | None:
        if name is not None and name not in plugins.available(group):
            raise user_error(plugins.unknown_name_message(group, name))
        return name

    return check


def _is_regular(path: Path) -> bool:
    try:
        checked_path(path)
        return True
    except PathProblem:
        return False


# ---------------------------------------------------------------- model


_PYTHON_NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


class InputSpec(BaseModel):
    """A model input with its element type: integer inputs (token ids) may only index embedding tables."""

    model_config = ConfigDict(extra="forbid")

    shape: list[PositiveInt | None] = Field(description="The input's shape; null marks the dynamic (batch) dimension.")
    dtype: Literal["float32", "int64", "int32"] = Field(
        default="float32", description="Element type: float32, or int64/int32 for indices into an embedding table."
    )


def _input_form(entry: Any) -> str:
    """Which form a model.inputs entry has, so a bad one is reported against that form alone."""
    return "spec" if isinstance(entry, dict) else "shape"


InputEntry = Annotated[
    Annotated[list[PositiveInt | None], Tag("shape")] | Annotated[InputSpec, Tag("spec")], Discriminator(_input_form)
]


class ModelSpec(BaseModel):
    """Where the model comes from and how to call it."""

    model_config = ConfigDict(extra="forbid")

    framework: str | None = Field(
        default=None,
        description="Tracer to use (an entry point of dabuild.tracers, e.g. numpy). "
        "Default: chosen from the model object's package, or a model file's suffix.",
    )
    source: str = Field(
        description="'file.py:name' (file relative to the recipe), 'package.module:name', "
        "or a model file such as model.onnx."
    )
    weights: ExistingPath | None = Field(
        default=None,
        description="An .npz of arrays; when given, `name` in `source` is a factory called with them.",
    )
    inputs: dict[str, InputEntry] | None = Field(
        default=None,
        description="Input name -> shape (null marks a dynamic (batch) dimension), or -> {shape, dtype} for an "
        "integer input (token ids feeding an embedding): dtype int64 or int32.",
    )
    depends: list[ExistingPath] = Field(
        default=[], description="Further files the model reads; a change to any of them re-traces."
    )

    _check_framework = field_validator("framework")(_plugin_name(plugins.TRACERS))

    @field_validator("source")
    @classmethod
    def _check_source(cls, source: str, info: ValidationInfo) -> str:
        """Checks the form and the file, but imports nothing: validation must not run user code."""
        base = _base_dir(info)
        target, colon, name = source.rpartition(":")
        is_file = target.endswith(".py") or "/" in target or "\\" in target
        if colon and (is_file or _PYTHON_NAME.match(target)) and not _is_regular(base / source):
            if not _PYTHON_NAME.match(name):
                raise user_error(f"model source {source!r}: {name!r} is not a Python name")
            if is_file:
                _user_file(base, target)
            return source
        path = base / source
        if path.suffix == ".py":
            raise user_error(f"model source {source!r} names a Python file but not the object in it: write '{source}:<name>'")
        if not path.suffix:
            raise user_error(
                f"model source {source!r}: expected 'file.py:name', 'package.module:name' "
                "or a model file with a suffix such as model.onnx"
            )
        _user_file(base, source)
        return source


# ---------------------------------------------------------------- data

class DataSpec(BaseModel):
    """Arrays from one .npz file."""

    model_config = ConfigDict(extra="forbid")

    source: ExistingPath = Field(description="An .npz file, relative to the recipe.")
    x: str | Annotated[dict[str, str], Field(min_length=1)] = Field(
        default="x",
        validate_default=True,
        description="Key of the input array, or input name -> key for models with several inputs.",
    )
    y: str | None = Field(default=None, description="Key of the labels (needed for evaluation).")
    samples: PositiveInt | None = Field(default=None, description="Use only the first N rows (default: all).")
    batch_size: PositiveInt = Field(default=64, description="Rows per batch when running the model.")

    @field_validator("source")
    @classmethod
    def _readable_archive(cls, source: Path) -> Path:
        _npz_shapes(source)
        return source

    @field_validator("x")
    @classmethod
    def _inputs_present(cls, x: str | dict[str, str], info: ValidationInfo) -> str | dict[str, str]:
        source = info.data.get("source")
        if source is not None:
            for key in [x] if isinstance(x, str) else x.values():
                _array_rows(source, key)
        return x

    @field_validator("y")
    @classmethod
    def _labels_present(cls, y: str | None, info: ValidationInfo) -> str | None:
        source, x = info.data.get("source"), info.data.get("x")
        if source is None or y is None:
            return y
        rows = _array_rows(source, y)
        shapes = _npz_shapes(source)
        for key in [x] if isinstance(x, str) else x.values() if isinstance(x, dict) else []:
            if shapes.get(key, (rows,))[:1] != (rows,):
                raise user_error(f"labels {y!r} have {rows} rows but inputs {key!r} have {shapes[key][0]}")
        return y


class DataSection(BaseModel):
    """Data for calibration (ranges) and for evaluation (the accuracy the tuner protects)."""

    model_config = ConfigDict(extra="forbid")

    metric: str = Field(
        default="accuracy",
        description="accuracy: argmax against integer labels; top_k (k = 5) or top_<k> such as top_3: share of "
        "samples whose integer label is among the k largest outputs; mse: mean squared error; or your own "
        "'file.py:function' (file relative to the recipe) or 'package.module:function', called as "
        "function(outputs, labels) -> float, higher is better unless the function has `higher_is_better = False`.",
    )
    calibration: DataSpec = Field(description="Representative inputs used to measure tensor ranges.")
    evaluation: DataSpec = Field(description="Held-out inputs and labels used to score each candidate.")

    @field_validator("metric")
    @classmethod
    def _known_metric(cls, metric: str, info: ValidationInfo) -> str:
        """A built-in name, or a function whose file exists; nothing is imported (validation runs no user code)."""
        if metric in BUILTIN_METRICS or top_k_of(metric) is not None:
            return metric
        target, colon, name = metric.rpartition(":")
        if not colon:  # only a built-in name can be meant
            raise user_error(f"data.metric: input should be one of {METRIC_FORMS} (got {metric!r})")
        if not _PYTHON_NAME.match(name) or not (target.endswith(".py") or _PYTHON_NAME.match(target)):
            raise user_error(f"data.metric: {metric!r} is none of {METRIC_FORMS}")
        if target.endswith(".py"):
            try:
                checked_path(_base_dir(info) / target, shown=target)
            except PathProblem as problem:
                raise user_error(f"metric {metric!r}: {problem}") from None
        else:
            _module_exists(metric, target, _base_dir(info))
        return metric

    @field_validator("evaluation")
    @classmethod
    def _has_labels(cls, evaluation: DataSpec, info: ValidationInfo) -> DataSpec:
        if evaluation.y is None:
            metric = info.data.get("metric", "accuracy")
            raise user_error(f"evaluation data needs labels for metric {metric!r}: add `y: <key>`", at_key=True)
        return evaluation


def _module_exists(metric: str, target: str, base_dir: Path) -> None:
    """The metric's top-level module is found (beside the recipe or installed) without importing anything:
    `PathFinder.find_spec` of a top-level name only looks at files."""
    import importlib.machinery
    import sys

    top = target.split(".")[0]
    if top in sys.modules or importlib.machinery.BuiltinImporter.find_spec(top) is not None:
        return
    if importlib.machinery.PathFinder.find_spec(top, [str(base_dir), *sys.path]) is None:
        raise user_error(f"metric {metric!r}: no module named {top!r} beside the recipe or installed "
                         "(a file is written path/to/file.py:function)")


# ---------------------------------------------------------------- tuning and targets


class ChoiceNarrowing(BaseModel):
    """The values one role may use: each list keeps only those entries of the capability's list."""

    model_config = ConfigDict(extra="forbid")

    dtype: list[str] | None = Field(
        default=None, min_length=1, description="e.g. [int8]; include fp32 to keep fp32 fallback, [fp32] forces it."
    )
    scheme: list[Literal["sym", "asym", "pot"]] | None = Field(default=None, min_length=1,
                                                               description="sym, asym and/or pot.")
    granularity: list[Literal["per_tensor", "per_channel"]] | None = Field(
        default=None, min_length=1, description="per_tensor and/or per_channel."
    )
    algorithm: list[Literal["minmax", "percentile", "entropy", "mse"]] | None = Field(
        default=None, min_length=1, description="Calibration algorithms to try."
    )


class RoleNarrowing(BaseModel):
    """Narrowings of an op's weight and activation choices."""

    model_config = ConfigDict(extra="forbid")

    weight: ChoiceNarrowing | None = Field(default=None, description="For the op's constant weight.")
    activation: ChoiceNarrowing | None = Field(default=None, description="For the op's output activation.")


class SpaceNarrowing(BaseModel):
    """INC's op_type_dict and op_name_dict: op_name wins over op_type, field by field."""

    model_config = ConfigDict(extra="forbid")

    op_type: dict[str, RoleNarrowing] = Field(default={}, description="Op type (e.g. dense) -> narrowing.")
    op_name: dict[str, RoleNarrowing] = Field(default={}, description="Node name -> narrowing.")


class AccuracyGoal(BaseModel):
    """How much accuracy quantization may cost."""

    model_config = ConfigDict(extra="forbid")

    criterion: Literal["relative", "absolute"] = Field(
        default="relative", description="relative: a fraction of the float score; absolute: score points."
    )
    tolerable_loss: NonNegativeFloat = Field(default=0.01,
                                             description="The largest accepted loss (0.01 = 1% relative).")


class TuningSpec(BaseModel):
    """The search for the cheapest quantization that meets the accuracy goal."""

    model_config = ConfigDict(extra="forbid")

    strategy: str | None = Field(
        default=None,
        description="An entry point of dabuild.strategies, e.g. basic. Default: given when the model carries "
        "its own quantization (QDQ ONNX, QONNX, quantization-aware Keras layers), else basic.",
    )
    accuracy: AccuracyGoal = Field(default_factory=AccuracyGoal, description="The goal every result must meet.")
    max_trials: PositiveInt = Field(default=100, description="Most candidate configurations to evaluate.")
    timeout: NonNegativeFloat = Field(default=0, description="Seconds before the search stops (0 = no limit); the "
                                                                  "first trial is always scored.")
    objective: Literal["size", "bops", "estimate"] | None = Field(
        default=None,
        description="What 'cheapest' means among configs meeting the goal: size (total weight bits), bops "
        "(bit operations: multiply-accumulates x weight bits x activation bits) or estimate (the cost model "
        "the capability names, e.g. da4ml's LUTs). Default: estimate where the capability names a cost_model, "
        "else size.",
    )
    seed: int = Field(default=0, ge=0, lt=2**32, strict=True,
                      description="Seed of the random and bayesian strategies (0 to 2**32 - 1).")
    allow_miss: StrictBool = Field(
        default=False, description="Accept the best-found config when none meets the goal (else the build fails)."
    )
    bias_correction: StrictBool = Field(
        default=False,
        description="Correct each dense and conv bias for the mean output error its quantized weights cause: "
        "b - E[x] (W_q s_w - W), with the input mean E[x] per channel from the calibration statistics. "
        "Helps most with narrow (int4) weights.",
    )
    space: SpaceNarrowing = Field(
        default_factory=SpaceNarrowing,
        description="Narrow the capability's choices per op type or per node name (INC's op_type_dict / "
        "op_name_dict); anything the capability does not offer is an error.",
    )

    _check_strategy = field_validator("strategy")(_plugin_name(plugins.STRATEGIES))


DEFAULT_CHECK_SAMPLES = 256  # check_io.samples when a recipe names none


class CheckIO(BaseModel):
    """How an artifact's outputs are compared with dabuild's reference."""

    model_config = ConfigDict(extra="forbid")

    tolerance: Tolerance | None = Field(
        default=None, description="Tolerance level as tract defines them (default: the target's own)."
    )
    samples: PositiveInt | Literal["all"] = Field(
        default=DEFAULT_CHECK_SAMPLES,
        description=f"Evaluation rows to check: the first N (default {DEFAULT_CHECK_SAMPLES}, enough to prove an "
        "artifact's kernels on every layer while an emulated core checks in seconds), or `all`.")


class TargetSpec(BaseModel):
    """One artifact to export and prove."""

    model_config = ConfigDict(extra="forbid")

    name: Slug = Field(description="Names the target's build outputs and tasks (export:<name>, check:<name>).")
    kind: str = Field(description="An entry point of dabuild.targets, e.g. c.")
    capability: str | None = Field(
        default=None, description="Capability to tune for (default: the target kind's own)."
    )
    options: dict[str, Any] = Field(default={}, description="Settings of the target kind (its Options model).")
    check_io: CheckIO = Field(default_factory=CheckIO, description="How the artifact is checked.")

    _check_kind = field_validator("kind")(_plugin_name(plugins.TARGETS))


@dataclass(frozen=True)
class ResolvedTarget:
    """A recipe target with its plugin resolved: the class its kind names, its options as that class's `Options`
    model, and the capability it runs (the recipe's or its kind's own, as `Target.capability_for` narrows it to what
    the class writes with these options)."""

    name: str
    target_class: Any
    options: BaseModel
    capability: CapabilitySpec

    def target(self) -> Any:
        """The target plugin, ready to export, run or check."""
        return self.target_class(self.options, self.capability)


class Recipe(BaseModel):
    """A dabuild recipe (recipe.yaml)."""

    model_config = ConfigDict(extra="forbid")

    name: Slug = Field(description="Name of the build.")
    description: str = Field(default="", description="Free text for people.")
    model: ModelSpec = Field(description="The model to trace.")
    data: DataSection = Field(description="Calibration and evaluation data.")
    tuning: TuningSpec = Field(default_factory=TuningSpec, description="The quantization search.")
    capabilities: list[ExistingFileOrFolder] = Field(
        default=[], description="Extra capability YAML files (or folders of them), relative to the recipe."
    )
    targets: list[TargetSpec] = Field(min_length=1, description="Artifacts to build; at least one.")

    _path: Path | None = PrivateAttr(default=None)
    _base_dir: Path | None = PrivateAttr(default=None)
    _document: YamlDocument | None = PrivateAttr(default=None)
    _resolved: dict[str, ResolvedTarget] = PrivateAttr(default_factory=dict)
    _known_capabilities: dict[str, CapabilitySpec] = PrivateAttr(default_factory=dict)

    @property
    def resolved(self) -> dict[str, ResolvedTarget]:
        """Each target, by name, with its plugin resolved (set by `load_recipe`)."""
        return self._resolved

    @property
    def known_capabilities(self) -> dict[str, CapabilitySpec]:
        """Every capability by name, bundled and the recipe's own files, as found when it was loaded."""
        return self._known_capabilities

    @property
    def document(self) -> YamlDocument | None:
        """The recipe file as read, with every value's line: later checks report at the line to edit."""
        return self._document

    @property
    def path(self) -> Path:
        """The recipe file (absolute), set by `load_recipe` (the one maker of recipes)."""
        if self._path is None:
            raise RuntimeError("this Recipe was not made by load_recipe, so it has no file")
        return self._path

    @property
    def base_dir(self) -> Path:
        """The recipe's folder: where its relative paths start."""
        if self._base_dir is None:
            raise RuntimeError("this Recipe was not made by load_recipe, so it has no folder")
        return self._base_dir


# ---------------------------------------------------------------- loading


def load_recipe(path: Path | str) -> Recipe:
    """Read and validate a recipe; ValidationError listing every problem as file:line:col."""
    path = Path(path)
    document = load_yaml(path)
    data = require_mapping(document, "a recipe")
    base_dir = path.resolve().parent
    diagnostics = list(document.problems)
    recipe: Recipe | None = None
    try:
        recipe = Recipe.model_validate(data, context={"base_dir": base_dir})
    except PydanticValidationError as exc:
        diagnostics += pydantic_diagnostics(document, exc, Recipe)
    listed = data.get("capabilities")
    extra = [_readable(base_dir, p) for p in listed if isinstance(p, str)] if isinstance(listed, list) else []
    capabilities, problems = collect_capabilities([p for p in extra if p is not None])  # the rest: pydantic's
    diagnostics += problems
    resolved, problems = _check_targets(document, data.get("targets"), base_dir, None if problems else capabilities)
    diagnostics += problems
    if recipe is not None and not problems:
        diagnostics += _check_objective(document, recipe.tuning.objective, recipe.targets, resolved, capabilities)
        diagnostics += _check_float_islands(document, recipe.tuning.space, recipe.targets, resolved, capabilities)
    if recipe is not None:
        diagnostics += _check_space_op_types(document, recipe.tuning.space)
    if diagnostics:
        raise ValidationError(diagnostics)
    assert recipe is not None
    for target, found in zip(recipe.targets, resolved):
        target.options, target.capability, target.check_io.tolerance = found.options, found.capability, found.tolerance
        recipe._resolved[target.name] = ResolvedTarget(
            target.name, found.target_class, found.validated,
            found.target_class.capability_for(capabilities[found.capability], found.options))
    recipe._path, recipe._base_dir, recipe._document = path.resolve(), base_dir, document
    recipe._known_capabilities = capabilities
    return recipe


@dataclass
class _Found:
    """What `_check_targets` resolved of one target (its options in full, as JSON and as the Options model)."""

    target_class: Any
    options: dict
    validated: Any
    capability: str
    tolerance: Tolerance


def _check_targets(
    document: YamlDocument, targets: Any, base_dir: Path, capabilities: dict[str, CapabilitySpec] | None
) -> tuple[list[_Found], list[Diagnostic]]:
    """What needs the target classes or spans targets, checked on the raw data so it runs even when
    other parts of the recipe are wrong. Returns what it resolved of each target, in full."""
    resolved: list[_Found] = []
    diagnostics: list[Diagnostic] = []
    first_line: dict[str, int] = {}
    for i, raw in enumerate(targets if isinstance(targets, list) else []):
        if not isinstance(raw, dict):
            continue
        loc = ("targets", i)
        name = raw.get("name")
        if isinstance(name, str) and name in first_line:
            message = f"duplicate target name {name!r} (first used at line {first_line[name]})"
            diagnostics.append(document.diagnostic(loc + ("name",), message))
        elif isinstance(name, str):
            first_line[name] = document.position(loc + ("name",))[0]
        kind = raw.get("kind")
        if not isinstance(kind, str) or kind not in plugins.available(plugins.TARGETS):
            continue  # reported by pydantic
        try:
            target_class = plugins.load(plugins.TARGETS, kind)
        except Exception as exc:  # noqa: BLE001 - a broken plugin is the user's environment, not a dabuild crash
            message = f"target kind {kind!r} cannot be loaded: {type(exc).__name__}: {exc}"
            diagnostics.append(document.diagnostic(loc + ("kind",), message))
            continue
        options, validated = raw.get("options", {}), None
        if isinstance(options, dict):
            try:
                validated = target_class.Options.model_validate(options, context={"base_dir": base_dir})
                options = validated.model_dump(mode="json")
            except PydanticValidationError as exc:
                diagnostics += pydantic_diagnostics(document, exc, target_class.Options, loc + ("options",))
        capability = raw.get("capability") or target_class.capability
        if capabilities is not None and isinstance(capability, str) and capability not in capabilities:
            if raw.get("capability"):
                where, message = "capability", unknown_name_message("capability", capability, capabilities)
            else:
                where = "kind"
                message = (
                    f"target kind {kind!r} needs capability {capability!r}, which no capability file defines;"
                    f" available: {', '.join(sorted(capabilities)) or 'none'}"
                )
            diagnostics.append(document.diagnostic(loc + (where,), message))
        check_io = raw.get("check_io")
        tolerance = check_io.get("tolerance") if isinstance(check_io, dict) else None
        resolved.append(_Found(target_class, options, validated, capability,
                               tolerance or target_class.default_tolerance))
    return resolved, diagnostics


def _check_objective(document: YamlDocument, objective: str | None, targets: list[TargetSpec],
                     resolved: list[_Found], capabilities: dict[str, CapabilitySpec]) -> list[Diagnostic]:
    """`tuning.objective: estimate` needs every tuned capability to name a cost model."""
    if objective != "estimate":
        return []
    for target, found in zip(targets, resolved):
        capability = found.capability
        spec = capabilities.get(capability)
        if spec is not None and spec.cost_model is None:
            message = (f"objective 'estimate' needs a cost estimate, but capability {capability!r} (target "
                       f"{target.name!r}) names no cost_model; use size or bops")
            return [document.diagnostic(("tuning", "objective"), message)]
    return []


def _check_float_islands(document: YamlDocument, space: SpaceNarrowing, targets: list[TargetSpec],
                         resolved: list[_Found], capabilities: dict[str, CapabilitySpec]) -> list[Diagnostic]:
    """A dtype list naming fp32 asks for float islands: every tuned capability must run them, and every target
    with its options (a core without an FPU runs none)."""
    without = [(target.name, f"capability {found.capability!r} does not run float islands (fp32_fallback: false)")
               for target, found in zip(targets, resolved)
               if found.capability in capabilities and not capabilities[found.capability].fp32_fallback]
    for target, found in zip(targets, resolved):
        why = found.target_class.refuses_float_islands(found.options if isinstance(found.options, dict) else {})
        if why is not None:
            without.append((target.name, f"{why}, so it runs no float islands"))
    diagnostics = []
    for kind, entries in (("op_type", space.op_type), ("op_name", space.op_name)):
        for key, narrowing in entries.items():
            # an op_type's own float kernels are known now; an op_name's op type only once traced (tune's space)
            refusing = without or ([] if kind == "op_name" else _without_float_kernel(key, targets, resolved,
                                                                                      capabilities))
            for role in ("weight", "activation"):
                choices = getattr(narrowing, role)
                if refusing and choices is not None and "fp32" in (choices.dtype or []):
                    name, why = refusing[0]
                    diagnostics.append(document.diagnostic(
                        ("tuning", "space", kind, key, role, "dtype"),
                        f"fp32 asks for a float island, but target {name!r}: {why}"))
    return diagnostics


def _without_float_kernel(op: str, targets: list[TargetSpec], resolved: list[_Found],
                          capabilities: dict[str, CapabilitySpec]) -> list[tuple[str, str]]:
    """The targets whose capability, as they run it, has float islands but none of op `op`."""
    found = []
    for target, resolution in zip(targets, resolved):
        capability = resolution.capability
        spec = capabilities.get(capability)
        if spec is not None:
            spec = resolution.target_class.capability_for(spec, resolution.options)
        if spec is not None and spec.fp32_fallback and not spec.runs_float(op):
            kernels = ", ".join(spec.float_ops or [])
            found.append((target.name, f"capability {capability!r} has no float kernel for op {op!r} (float_ops: {kernels})"))
    return found


def _check_space_op_types(document: YamlDocument, space: SpaceNarrowing) -> list[Diagnostic]:
    """`tuning.space.op_type` keys must be IR op types: a misspelt one would narrow nothing. (What the
    capability offers and which nodes exist is checked against the traced graph: pipeline/preflight.py.)"""
    if not space.op_type:
        return []
    from dabuild.ir.ops import OPS

    return [document.diagnostic(("tuning", "space", "op_type", op), unknown_name_message("op type", op, OPS.names())
                                .replace("; available:", "; IR op types:"), key=True)
            for op in space.op_type if op not in OPS]


# ---------------------------------------------------------------- .npz headers


def _array_rows(source: Path, key: str) -> int:
    """Rows of array `key` in the .npz `source`; a user error if it is missing, scalar or empty."""
    shapes = _npz_shapes(source)
    if key not in shapes:
        close = difflib.get_close_matches(key, list(shapes), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise user_error(f"{source.name} has no array {key!r}{hint}; arrays: {', '.join(sorted(shapes)) or 'none'}")
    shape = shapes[key]
    if not shape:
        raise user_error(f"array {key!r} in {source.name} is a scalar; expected one sample per row")
    if shape[0] == 0:
        raise user_error(f"array {key!r} in {source.name} is empty (shape {shape})")
    descr = _npz_headers(source)[key][1]
    if not is_numeric(descr):
        raise user_error(f"array {key!r} in {source.name} has dtype {descr}; expected numbers (object arrays "
                         "are never read: they would be unpickled)")
    return shape[0]


def _npz_shapes(source: Path) -> dict[str, tuple[int, ...]]:
    return {name: shape for name, (shape, _) in _npz_headers(source).items()}


def _npz_headers(source: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    stat = source.stat()
    return _read_npz_headers(source, stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=16)
def _read_npz_headers(source: Path, mtime_ns: int, size: int) -> dict[str, tuple[tuple[int, ...], str]]:
    """Array name -> (shape, dtype) from the headers alone (limits.py checks each): no array is loaded and
    numpy is not imported."""
    try:
        return npz_headers(source, source.name)
    except UsageError as error:
        raise user_error(str(error)) from None
