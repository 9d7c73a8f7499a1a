"""The data and the tuning space checked against the traced model, before any other stage runs.

Validation (recipe.py) checks what the recipe and the files' headers tell; what
only the model tells (its inputs, its classes, its node names) is known once
`trace` has run. So the build traces first, then checks here, each problem a
diagnostic at the recipe's line (exit 2), and only then calibrates and tunes:
a label outside the model's classes would otherwise score every config 0 and
"meet" a goal of 0, and a shape mismatch would surface minutes into tuning.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from dabuild.data import read_array
from dabuild.errors import BuildError, Diagnostic, UsageError, ValidationError
from dabuild.ir.graph import Graph, TensorSpec
from dabuild.ir.ops.shape import out_of_range
from dabuild.metrics import BUILTIN_METRICS, top_k_of
from dabuild.recipe import Recipe
from dabuild.yamlpos import YamlDocument

_SPACE_KEY = re.compile(r"^tuning\.space\.(op_type|op_name)(?:\.([^.:]+))?(?:\.(weight|activation))?"
                        r"(?:\.(dtype|scheme|granularity|algorithm))?:")


def preflight(recipe: Recipe, graph_dir: Path, capabilities: list[Any]) -> None:
    """ValidationError listing every problem of the data and `tuning.space` against the traced graph.

    `capabilities` are the CapabilitySpecs the build tunes for.
    """
    document = recipe.document
    assert document is not None, "preflight needs a recipe read by load_recipe"
    graph = Graph.load(graph_dir)
    specs = graph.tensor_shapes()
    diagnostics: list[Diagnostic] = []
    for role in ("calibration", "evaluation"):
        diagnostics += _inputs(document, ("data", role), getattr(recipe.data, role), graph.inputs, graph)
    diagnostics += _labels(document, recipe, specs[graph.outputs[0]].shape)
    narrowing = recipe.tuning.space.model_dump(mode="json", exclude_none=True)
    for capability in capabilities:
        diagnostics += _space(document, graph, capability, narrowing)
    if diagnostics:
        raise ValidationError(sorted(set(diagnostics), key=lambda d: (d.line or 0, d.col or 0, d.message)))


def refuse_unbuildable(graph_dir: Path, exports: list[Any], recipe: Recipe | None = None) -> None:
    """Each target's `refuse` on the traced graph: a BuildError naming target, op and nodes it cannot build,
    before calibration and tuning spend any time. An option the model cannot honour (a UsageError naming the
    `option`, e.g. streaming a model that looks ahead) becomes a diagnostic at that option in the recipe."""
    from dabuild.quant.lowering import integer_forms

    graph = Graph.load(graph_dir)
    forms = integer_forms()
    for stage in exports:
        try:
            stage.runs["target"].refuse(graph, forms)
        except UsageError as error:
            option = getattr(error, "option", None)
            names = [target.name for target in recipe.targets] if recipe is not None else []
            if option is None or recipe is None or recipe.document is None or stage.target not in names:
                raise
            index = names.index(stage.target)
            raise ValidationError([recipe.document.diagnostic(
                ("targets", index, "options", option),
                f"target {stage.target!r}: {error} (model {recipe.model.source})")]) from None


def _used(spec: Any, key: str) -> np.ndarray:
    array = read_array(Path(spec.source), key)
    return array if spec.samples is None else array[: spec.samples]


def untraced_inputs(recipe: Recipe) -> list[TensorSpec] | None:
    """The model's inputs as known without tracing it: an .onnx file's graph inputs (read from the protobuf, no
    weights loaded), else the names and shapes `model.inputs` declares; None when only tracing tells (a .keras or
    .pt2 file, a model without `model.inputs`)."""
    from dabuild.trace.base import declared_inputs

    source = recipe.base_dir / recipe.model.source
    if ":" not in recipe.model.source and source.suffix == ".onnx" and source.is_file():
        try:
            from dabuild.trace.onnx_frontend.model_file import graph_inputs
        except ImportError:  # onnx is not installed: tracing says so
            return None
        found = graph_inputs(source)
        return None if found is None else [
            TensorSpec(name, tuple(d if isinstance(d, int) else None for d in dims), dtype) for name, dims, dtype in found]
    shapes, dtypes = declared_inputs(recipe.model.inputs)
    if not shapes:
        return None
    return [TensorSpec(name, (None, *shape[1:]), dtypes.get(name, "float32")) for name, shape in shapes.items()]


def check_data_untraced(recipe: Recipe) -> bool:
    """`dabuild validate`'s share of the preflight: the data's input names and per-sample shapes against the
    inputs known without tracing (`untraced_inputs`); ValidationError at the recipe's lines. False when the
    model must be traced to know its inputs (the build checks them then)."""
    inputs = untraced_inputs(recipe)
    if inputs is None:
        return False
    document = recipe.document
    assert document is not None, "needs a recipe read by load_recipe"
    diagnostics: list[Diagnostic] = []
    for role in ("calibration", "evaluation"):
        diagnostics += _inputs(document, ("data", role), getattr(recipe.data, role), inputs, None)
    if diagnostics:
        raise ValidationError(sorted(set(diagnostics), key=lambda d: (d.line or 0, d.col or 0, d.message)))
    return True


def _inputs(document: YamlDocument, loc: tuple, spec: Any, inputs: list[TensorSpec],
            graph: Graph | None) -> list[Diagnostic]:
    """Input count and each input's per-sample shape against the model's `inputs`, and finite values; with the
    traced `graph`, integer inputs against the tables they index too."""
    names = [tensor.name for tensor in inputs]
    if isinstance(spec.x, str):
        if len(names) != 1:
            return [document.diagnostic(loc + ("x",), f"names one array, but the model has {len(names)} inputs "
                                                      f"({', '.join(names)}); map each: x: {{input_name: key}}")]
        keys = {names[0]: spec.x}
        where = {names[0]: loc + ("x",)}
    else:
        if set(spec.x) != set(names):
            return [document.diagnostic(loc + ("x",), f"maps inputs {', '.join(sorted(spec.x))}, but the model's "
                                                      f"inputs are {', '.join(names)}")]
        keys = dict(spec.x)
        where = {name: loc + ("x", name) for name in names}
    found = []
    integer = set(graph.integer_inputs()) if graph is not None else set()
    for tensor in inputs:
        array = _used(spec, keys[tensor.name])
        want = tensor.shape[1:]
        if not _fits(want, array.shape[1:]):
            shape = "x".join("?" if d is None else str(d) for d in want)
            found.append(document.diagnostic(where[tensor.name], f"array {keys[tensor.name]!r} has samples of shape "
                                             f"{list(array.shape[1:])}, but model input {tensor.name!r} takes "
                                             f"{shape or 'scalars'}{_layout_hint(want, array.shape[1:])}"))
        elif array.dtype.kind == "f" and not np.isfinite(array).all():
            bad = int(array.size - np.isfinite(array).sum())
            found.append(document.diagnostic(where[tensor.name], f"array {keys[tensor.name]!r} has {bad} NaN or "
                                             "infinite values in the rows used"))
        elif graph is not None and tensor.name in integer:
            problem = _indices(graph, tensor.name, array)
            if problem is not None:
                found.append(document.diagnostic(where[tensor.name], f"array {keys[tensor.name]!r}: {problem}"))
    return found


def _indices(graph: Graph, name: str, array: np.ndarray) -> str | None:
    """Why the data of integer input `name` cannot index the tables it indexes (integers, in every table's rows)."""
    if array.dtype.kind not in "iu":
        return (f"holds {array.dtype} values, but model input {name!r} takes integers (indices into an embedding "
                "table); store it as integers")
    shapes = graph.tensor_shapes()
    for node in graph.nodes:
        rows = shapes[node.inputs[1]].shape[0] if node.op == "embedding" and node.inputs[0] == name else None
        if rows is not None:
            problem = out_of_range(array, rows)
            if problem is not None:
                return f"indexes the table of node {node.name!r} (embedding): {problem}"
    return None


def _layout_hint(want: tuple[int | None, ...], got: tuple[int, ...]) -> str:
    """A hint where the data is the model's channels-first shape stored channels-last (images as HWC)."""
    if len(got) < 2 or len(got) != len(want):
        return ""
    last = len(got)
    if _fits(want, (got[-1], *got[:-1])):
        axes = (0, last, *range(1, last))
        return (f" (channels last? the model takes channels first: store np.transpose(x, {axes}), "
                "from [N, H, W, C] to [N, C, H, W])")
    if _fits(want, (*got[1:], got[0])):
        axes = (0, *range(2, last + 1), 1)
        return f" (channels first? the model takes channels last: store np.transpose(x, {axes}))"
    return ""


def _fits(want: tuple[int | None, ...], got: tuple[int, ...]) -> bool:
    """Does a per-sample shape `got` match `want`, where None (a dynamic dimension) matches any size?"""
    return len(got) == len(want) and all(w is None or w == g for w, g in zip(want, got, strict=True))


def _labels(document: YamlDocument, recipe: Recipe, output: tuple[int | None, ...]) -> list[Diagnostic]:
    """Labels against the model's output for the built-in metrics: shape, integer classes in range."""
    spec, metric = recipe.data.evaluation, recipe.data.metric
    if spec.y is None or (metric not in BUILTIN_METRICS and top_k_of(metric) is None):
        return []
    loc = ("data", "evaluation", "y")
    labels = _used(spec, spec.y)
    if metric == "mse":
        want = output[1:]
        if not _fits(want, labels.shape[1:]):
            return [document.diagnostic(loc, f"mse compares targets with the model's outputs, of shape {list(want)} "
                                             f"per sample; {spec.y!r} has {list(labels.shape[1:])}")]
        return []
    classes = output[-1]
    if labels.shape[1:] != tuple(output[1:-1]):
        return [document.diagnostic(loc, f"{metric} needs one class index per sample (shape "
                                         f"{list(output[1:-1])}); {spec.y!r} has {list(labels.shape[1:])}"
                                         + (" (one-hot? store the class indices)" if labels.ndim == 2 else ""))]
    if labels.dtype.kind not in "iu":
        return [document.diagnostic(loc, f"{metric} compares class indices, but {spec.y!r} holds {labels.dtype} "
                                         "values; store the labels as integers")]
    low, high = int(labels.min()), int(labels.max())
    if classes is not None and (low < 0 or high >= classes):
        return [document.diagnostic(loc, f"labels {spec.y!r} range over {low}..{high}, but the model has "
                                         f"{classes} classes (0..{classes - 1})")]
    return []


def _space(document: YamlDocument, graph: Graph, capability: Any, narrowing: dict) -> list[Diagnostic]:
    """`tuning.space` against the graph and a capability: the same check tuning starts with."""
    from dabuild.tune.space import build_space

    try:
        build_space(graph, capability, narrowing)
    except BuildError as error:
        message = str(error)
        match = _SPACE_KEY.match(message)
        if match is None:  # not about the narrowing (an op no capability runs): tuning reports it
            return [document.diagnostic(("tuning", "space"), message)] if "tuning.space" in message else []
        loc = ("tuning", "space", *[part for part in match.groups() if part])
        return [document.diagnostic(loc, message[match.end():].strip(), key=match.group(2) is not None
                                    and match.group(3) is None)]
    return []
