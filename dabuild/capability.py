"""What a backend can run quantized, read from capability YAML files.

A capability file names a backend and, per op type, the weight and activation
choices it supports (dtype, scheme, granularity, calibration algorithm); the
first entry of every list is the default choice, and `default` covers every op
type not listed. Adding a backend whose ops dabuild already knows is one file.

Discovery order: the bundled `capabilities/` folder, then each entry of
$DABUILD_CAPABILITY_PATH (os.pathsep-separated; a folder means every *.yaml in
it), then the files a recipe lists under `capabilities:`. Two definitions of
one name are an error naming both files, except that a recipe's own file may
replace a bundled or $DABUILD_CAPABILITY_PATH one: the recipe is the most
specific statement of what the user wants, while two installed definitions of
one name can only be a mistake.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, field_validator
from pydantic import ValidationError as PydanticValidationError

from dabuild import plugins
from dabuild.errors import Diagnostic, ValidationError, unknown_name_message
from dabuild.resources import data_dir
from dabuild.yamlpos import YamlDocument, load_yaml, pydantic_diagnostics, require_mapping, user_error

ENV_PATH = "DABUILD_CAPABILITY_PATH"
COST_MODELS = "dabuild.cost_models"  # entry-point group: cost model name -> class pricing a QGraph

SLUG_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
_SLUG = re.compile(SLUG_PATTERN)


MAX_NAME = 100  # names become folder names with a prefix (export-<target>): far below a file system's 255


def _check_slug(value: str) -> str:
    if len(value) > MAX_NAME:
        raise user_error(f"name of {len(value)} characters: at most {MAX_NAME} (names become file names "
                         "inside the build directory)")
    if not _SLUG.match(value):
        raise user_error(
            f"invalid name {value!r}: use letters, digits, '.', '_' and '-', starting with a letter or digit"
            " (names become file names inside the build directory)"
        )
    return value


# A name that is safe as a single path component: build outputs can never escape the build directory.
Slug = Annotated[str, AfterValidator(_check_slug), Field(json_schema_extra={"pattern": SLUG_PATTERN})]


class QuantChoices(BaseModel):
    """The quantization choices a backend offers for one tensor role; the first of each list is the default."""

    model_config = ConfigDict(extra="forbid")

    dtype: list[str] = Field(min_length=1, description="Integer types it can store, e.g. [int8, int4].")
    scheme: list[Literal["sym", "asym", "pot"]] = Field(
        default=["sym"], min_length=1,
        description="sym: zero point 0; asym: a zero point per tensor; pot: sym with power-of-two scales (fixed point).",
    )
    granularity: list[Literal["per_tensor", "per_channel"]] = Field(
        default=["per_tensor"], min_length=1, description="One scale per tensor, or one per output channel."
    )
    algorithm: list[Literal["minmax", "percentile", "entropy", "mse"]] = Field(
        default=["minmax"], min_length=1, description="Calibration algorithms that pick the ranges."
    )


class OpCapability(BaseModel):
    """What an op type may use for its weights and its activations (None: that role stays float)."""

    model_config = ConfigDict(extra="forbid")

    weight: QuantChoices | None = Field(default=None, description="Choices for the op's constant weights.")
    activation: QuantChoices | None = Field(default=None, description="Choices for the op's output tensor.")


class CapabilitySpec(BaseModel):
    """One backend's quantization capability, as read from a capability YAML file."""

    model_config = ConfigDict(extra="forbid")

    name: Slug = Field(description="Name recipes use in a target's `capability:`.")
    backend: str = Field(description="The runtime or toolchain this describes, e.g. c, onnxruntime.")
    version: str = Field(description="Version of the backend the capability was written for.")
    description: str = Field(default="", description="Free text for people.")
    precisions: list[str] = Field(min_length=1, description="Precisions the backend can run, e.g. [int8].")
    fp32_fallback: bool = Field(default=False, description="Whether the backend runs float islands: nodes kept in float32, with "
                                  "quantize/dequantize at the island's boundary (dabuild.qir.layers.fallback).")
    float_ops: list[str] | None = Field(
        default=None, description="The op types a float island may hold (with fp32_fallback), within those the "
        "target writes in float (its own table, Target.float_ops, shown in docs/ops.md); none listed: all of those.")
    cost_model: str | None = Field(
        default=None,
        description="A cost estimate of the backend (an entry point of dabuild.cost_models, e.g. da4ml), which "
        "tuning.objective `estimate` minimises; none: the search counts bits (size or bops).",
    )
    rounding: Literal["dabuild", "tflm", "tflm-single"] | None = Field(
        default=None, description="The requantization rounding (dabuild.qir.fixed_point.ROUNDINGS) of a target "
        "that takes it from here when the recipe's `rounding` option says nothing (the tflite target: tflm); "
        "none: dabuild's own.")
    ops: dict[str, OpCapability] = Field(
        description="Per op type (e.g. dense, relu) the allowed choices; `default` covers every other op."
    )

    _path: Path | None = PrivateAttr(default=None)

    @field_validator("cost_model")
    @classmethod
    def _known_cost_model(cls, name: str | None) -> str | None:
        if name is not None and name not in plugins.available(COST_MODELS):
            raise user_error(unknown_name_message("cost model", name, plugins.available(COST_MODELS)))
        return name

    @field_validator("ops")
    @classmethod
    def _has_default(cls, ops: dict[str, OpCapability]) -> dict[str, OpCapability]:
        if "default" not in ops:
            raise user_error("ops must contain a 'default' entry (it covers every op not listed)", at_key=True)
        return ops

    @property
    def path(self) -> Path | None:
        """The file this capability was read from (None when built in code)."""
        return self._path

    def runs_float(self, op_type: str, activation: str | None = None) -> bool:
        """Whether a node of `op_type` may be a float island here; with `activation`, the one fused into it (a conv's
        hard_swish), which the island computes as well, so it needs a float kernel too."""
        listed = self.float_ops is None or op_type in self.float_ops
        fused = activation in (None, "none") or self.float_ops is None or activation in self.float_ops
        return self.fp32_fallback and listed and fused

    def for_op(self, op_type: str) -> OpCapability:
        """The choices for `op_type`: its own entry, else `default`."""
        return self.ops.get(op_type, self.ops["default"])


def load_capability(path: Path | str) -> CapabilitySpec:
    """Read and validate one capability file; ValidationError listing every problem as file:line:col."""
    spec, _, diagnostics = _read(Path(path))
    if diagnostics:
        raise ValidationError(diagnostics)
    assert spec is not None
    return spec


def discover_capabilities(extra: Iterable[Path] = ()) -> dict[str, CapabilitySpec]:
    """Every known capability by name: bundled, then $DABUILD_CAPABILITY_PATH, then `extra` (see module doc)."""
    specs, diagnostics = collect_capabilities(extra)
    if diagnostics:
        raise ValidationError(diagnostics)
    return specs


def collect_capabilities(extra: Iterable[Path] = ()) -> tuple[dict[str, CapabilitySpec], list[Diagnostic]]:
    """Like `discover_capabilities`, but returns the valid ones together with the problems found.

    The recipe loader uses this to report capability-file problems next to its
    own instead of stopping at the first broken file.
    """
    diagnostics: list[Diagnostic] = []
    installed = [data_dir("capabilities")]
    for entry in os.environ.get(ENV_PATH, "").split(os.pathsep):
        if entry and not Path(entry).exists():
            diagnostics.append(Diagnostic(entry, None, None, f"${ENV_PATH} names a path that does not exist"))
        elif entry:
            installed.append(Path(entry))
    specs: dict[str, CapabilitySpec] = {}
    from_recipe: set[str] = set()  # names whose current definition came from `extra`
    sources = [(path, False) for path in _yaml_files(installed)] + [(path, True) for path in _yaml_files(extra)]
    for path, is_recipe_file in sources:
        spec, document, problems = _read(path)
        diagnostics += problems
        if spec is None or document is None:
            continue
        earlier = specs.get(spec.name)
        if earlier is not None and earlier.path == spec.path:
            continue  # one file reached twice, e.g. listed in both places
        if earlier is not None and (not is_recipe_file or spec.name in from_recipe):
            diagnostics.append(
                document.diagnostic(("name",), f"capability {spec.name!r} is already defined in {earlier.path}")
            )
            continue
        specs[spec.name] = spec
        if is_recipe_file:
            from_recipe.add(spec.name)
    return specs, diagnostics


def _yaml_files(entries: Iterable[Path]) -> list[Path]:
    files: list[Path] = []
    for entry in entries:
        entry = Path(entry)
        files += sorted(entry.glob("*.yaml")) if entry.is_dir() else [entry]
    return [file.resolve() for file in files]


def _read(path: Path) -> tuple[CapabilitySpec | None, YamlDocument | None, list[Diagnostic]]:
    try:
        document = load_yaml(path)
        data = require_mapping(document, "a capability file")
    except ValidationError as exc:
        return None, None, exc.diagnostics
    diagnostics = list(document.problems)
    try:
        spec = CapabilitySpec.model_validate(data)
    except PydanticValidationError as exc:
        return None, None, diagnostics + pydantic_diagnostics(document, exc, CapabilitySpec)
    diagnostics += _unknown_names(document, spec)
    if diagnostics:
        return None, None, diagnostics
    spec._path = path.resolve()
    return spec, document, []


def _unknown_names(document: YamlDocument, spec: CapabilitySpec) -> list[Diagnostic]:
    """Op types the IR does not have and dtypes dabuild cannot lower, each at its line: a misspelt name
    would otherwise match nothing and silently leave its op on the `default` entry."""
    from dabuild.ir.ops import OPS
    from dabuild.qir.dtypes import type_names

    found = []
    precisions = [*type_names(), "fp32"]
    for index, precision in enumerate(spec.precisions):  # a type, fp32, or a range such as int2-int16
        unknown = [name for name in precision.split("-", 1) if name not in precisions]
        if unknown:
            message = unknown_name_message("precision", unknown[0], precisions)
            found.append(document.diagnostic(("precisions", index), message + "; dabuild has no type for it"))
    for index, op in enumerate(spec.float_ops or []):
        if op not in OPS:
            message = unknown_name_message("op type", op, OPS.names()).replace("; available:", "; IR op types:")
            found.append(document.diagnostic(("float_ops", index), message))
    for op, capability in spec.ops.items():
        if op != "default" and op not in OPS:
            message = unknown_name_message("op type", op, OPS.names()).replace("; available:", "; IR op types:")
            found.append(document.diagnostic(("ops", op), message, key=True))
        for role in ("weight", "activation"):
            choices = getattr(capability, role)
            for index, dtype in enumerate(choices.dtype if choices is not None else []):
                if dtype not in type_names():
                    message = unknown_name_message("dtype", dtype, type_names())
                    found.append(document.diagnostic(("ops", op, role, "dtype", index), message))
    return found
