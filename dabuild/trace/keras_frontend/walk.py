"""Visit a Keras model's layers in topological order and build the dabuild Graph.

Layout. Keras is channels last (N, *spatial, C); dabuild's IR is channels first
(N, C, *spatial). Each Keras tensor is held as a `Value` whose IR tensor is in
one of the two layouts, and converters ask for the one they need: a conv or a
pool reads channels first, a Flatten, Reshape or Dense reads Keras's own
layout, elementwise layers take either and keep it. A transpose is inserted
only where a tensor crosses from one layout to the other, once per tensor, so
a CNN converts at its input and once more where it is flattened; weights are
permuted to the IR's layout when converted (conv kernels to (O, C, *k)).
Graph inputs and outputs stay in Keras's layout: the data a recipe feeds and
the outputs a check compares are Keras's own.

Nested models (a Sequential used as a layer) are walked in place. Layers
without a converter, or whose options a converter cannot map, are collected;
the walk goes on past them (a placeholder of Keras's output shape stands in)
and one UsageError names them all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from dabuild.errors import BuildError, UsageError
from dabuild.ir.graph import Graph, Node, TensorSpec
from dabuild.ir.ops import OPS, ShapeError
from dabuild.names import unique_name
from dabuild.progress import Progress
from dabuild.registry import Registry
from dabuild.trace.keras_frontend.loading import import_keras

Shape = tuple["int | None", ...]


class Unsupported(Exception):
    """A layer (or one of its options) dabuild cannot map; reported with every other such layer at once."""


@dataclass(frozen=True)
class Value:
    """A Keras tensor as an IR tensor `name`, in Keras's layout or (`channels_first`) moved to the IR's."""

    name: str
    rank: int
    channels_first: bool = False

    def axis(self, keras_axis: int) -> int:
        """The IR axis holding Keras axis `keras_axis` (negative counts from the end)."""
        axis = keras_axis % self.rank
        if not self.channels_first or axis == 0:
            return axis
        return 1 if axis == self.rank - 1 else axis + 1


def to_channels_first(rank: int) -> list[int]:
    """The permutation (N, *spatial, C) -> (N, C, *spatial)."""
    return [0, rank - 1, *range(1, rank - 1)]


def to_channels_last(rank: int) -> list[int]:
    """The permutation (N, C, *spatial) -> (N, *spatial, C)."""
    return [0, *range(2, rank), 1]


@dataclass
class Call:
    """One layer call as a converter sees it: the layer, its tensor inputs, and its other arguments."""

    layer: Any
    inputs: list[Value]
    args: tuple[Any, ...] = ()  # positional arguments, Keras tensors replaced by their Values
    kwargs: dict[str, Any] = field(default_factory=dict)
    parameters: dict[str, np.ndarray] = field(default_factory=dict)  # replace the layer's variables of these names

    @property
    def weights(self) -> dict[str, np.ndarray]:
        """The layer's variables by short name (kernel, bias, gamma, moving_mean, ...) as numpy, or `parameters`."""
        variables = {v.name.split("/")[-1]: np.asarray(v.numpy()) for v in self.layer.weights}
        return {**variables, **self.parameters}


ConvertFunction = Callable[["Builder", Call], "Value | list[Value]"]
# Ops the Builder itself emits around any converter: layout moves, and the quantizer over a given weight.
PLUMBING = ("transpose", "fake_quant")


@dataclass(frozen=True)
class Converter:
    """A layer class's converter and the IR ops it may emit (docs/ops.md's coverage; `Builder.emit` refuses an
    op it does not list, PLUMBING aside)."""

    convert: ConvertFunction
    emits: tuple[str, ...]


CONVERTERS: Registry[Converter] = Registry("converter", "the keras frontend", (
    "dabuild.trace.keras_frontend.layers", "dabuild.trace.keras_frontend.hgq"), extra="keras")


AnyConverter = TypeVar("AnyConverter", bound=ConvertFunction)


def converts(*class_names: str, emits: tuple[str, ...]) -> Callable[[AnyConverter], AnyConverter]:
    """Register a converter for the Keras layer classes `class_names` (`ops.X` for a keras.ops operation X)
    that may emit the IR ops `emits`."""
    def register(function: AnyConverter) -> AnyConverter:
        for name in class_names:
            CONVERTERS.add(name, Converter(function, tuple(emits)))
        return function
    return register


class Builder:
    """Collects IR nodes and constants while layers are converted one after another."""

    def __init__(self, taken: set[str]):
        self.nodes: list[Node] = []
        self.constants: dict[str, np.ndarray] = {}
        self.specs: dict[str, TensorSpec] = {}
        self._taken = set(taken)
        self._moved: dict[tuple[str, bool], Value] = {}  # (tensor, to channels first) -> its transpose
        self.layer = "<model>"  # the layer being converted: names its nodes and its errors
        self.given_weights: dict[str, dict[str, Any]] = {}  # constant kind -> fake_quant attrs over it (HGQ2)
        self.declared: tuple[str, ...] | None = None  # the IR ops the running converter says it emits

    def fresh(self, base: str) -> str:
        return unique_name(base, self._taken)

    def shape(self, value: Value | str) -> Shape:
        return tuple(self.specs[value.name if isinstance(value, Value) else value].shape)

    def sizes(self, value: Value | str, start: int = 1) -> tuple[int, ...]:
        """The sizes of the axes from `start` on (1: every axis but the batch), which must be known."""
        dims = self.shape(value)[start:]
        known = tuple(d for d in dims if d is not None)
        if len(known) < len(dims):
            raise Unsupported(f"axes of dynamic size in {list(self.shape(value))}")
        return known

    def constant(self, array: np.ndarray, what: str) -> str:
        """An IR constant holding `array` (float arrays as float32), read through a fake_quant where
        `given_weights` names its kind: the layer came with it quantized."""
        array = np.ascontiguousarray(array, dtype=np.float32 if np.asarray(array).dtype.kind == "f" else None)
        name = self.fresh(f"{self.layer}/{what}")
        self.constants[name] = array
        self.specs[name] = TensorSpec(name, tuple(array.shape), str(array.dtype))
        if what in self.given_weights:
            return self.emit("fake_quant", [name], self.given_weights[what])
        return name

    def emit(self, op: str, inputs: Sequence[str], attrs: dict[str, Any] | None = None,
             output: str | None = None) -> str:
        """Append one single-output IR node of the current layer; the name of its output."""
        attrs = attrs or {}
        if self.declared is not None and op not in self.declared and op not in PLUMBING:
            raise BuildError(f"keras layer {self.layer!r}: its converter emits {op!r}, which it does not declare "
                             f"in `emits` ({', '.join(self.declared) or 'none'})")
        try:
            OPS[op].check_arity(len(inputs))
            [(shape, dtype)] = OPS[op].infer([self.specs[name] for name in inputs], attrs)
        except ShapeError as error:
            raise BuildError(f"keras layer {self.layer!r}: {op}: {error}") from None
        output = output or self.fresh(f"{self.layer}/{op}")
        self.specs[output] = TensorSpec(output, tuple(shape), dtype)
        self.nodes.append(Node(self.fresh(self.layer), op, list(inputs), [output], attrs))
        return output

    def value(self, op: str, inputs: Sequence[str], attrs: dict[str, Any] | None = None,
              channels_first: bool = False) -> Value:
        """`emit` wrapped as a Value in the given layout."""
        name = self.emit(op, inputs, attrs)
        return Value(name, len(self.specs[name].shape), channels_first)

    def layout(self, value: Value, channels_first: bool) -> Value:
        """`value` in the wanted layout, transposed (once per tensor) if it is in the other one."""
        if value.channels_first == channels_first or value.rank <= 2:
            return Value(value.name, value.rank, channels_first)
        key = (value.name, channels_first)
        if key not in self._moved:
            perm = to_channels_first(value.rank) if channels_first else to_channels_last(value.rank)
            self._moved[key] = self.value("transpose", [value.name], {"perm": perm}, channels_first)
        return self._moved[key]

    def channels_first(self, value: Value) -> Value:
        return self.layout(value, True)

    def keras_layout(self, value: Value) -> Value:
        return self.layout(value, False)


# ---------------------------------------------------------------- the model's structure


def _operations(model: Any) -> list[Any]:
    """The model's Keras nodes (one per layer call), inputs first, in an order that respects dependencies."""
    keras = import_keras()
    if isinstance(model, keras.Sequential):
        model = model._functional
    if not hasattr(model, "_nodes_by_depth"):
        raise UsageError(f"keras model {model.name!r} ({type(model).__name__}) is a subclassed model; the keras "
                         "frontend reads functional and Sequential models, whose layer graph Keras records")
    return [node for depth in sorted(model._nodes_by_depth, reverse=True) for node in model._nodes_by_depth[depth]]


def _functional(model: Any) -> Any:
    keras = import_keras()
    return model._functional if isinstance(model, keras.Sequential) else model


def input_names(model: Any) -> list[str]:
    """Graph input names: the names of the model's Input layers."""
    return [tensor._keras_history.operation.name for tensor in _functional(model).inputs]


def output_names(model: Any) -> list[str]:
    """Graph output names: the names of the layers that produce the model's outputs (made unique)."""
    taken: set[str] = set(input_names(model))
    return [unique_name(tensor._keras_history.operation.name, taken) for tensor in _functional(model).outputs]


def input_shapes(model: Any, declared: dict[str, Shape] | None) -> dict[str, Shape]:
    """Input shapes by name with the batch dynamic; `declared` (model.inputs) fills open sizes and must agree."""
    declared = declared or {}
    names = input_names(model)
    unknown = sorted(set(declared) - set(names))
    if unknown:
        raise UsageError(f"keras model {model.name!r}: model.inputs names {', '.join(map(repr, unknown))}, which the "
                         f"model does not take; its inputs: {', '.join(names)}")
    shapes: dict[str, Shape] = {}
    for name, tensor in zip(names, _functional(model).inputs):
        dims, wanted = tuple(tensor.shape), declared.get(name)
        if wanted is not None and (len(wanted) != len(dims) or any(
                d is not None and w is not None and d != w for d, w in zip(dims[1:], wanted[1:]))):
            raise UsageError(f"keras model {model.name!r}: input {name!r} has shape {list(dims)}, but model.inputs "
                             f"gives {list(wanted)}")
        filled = tuple(d if d is not None else (wanted[axis] if wanted else None) for axis, d in enumerate(dims))
        if None in filled[1:]:
            raise UsageError(f"keras model {model.name!r}: input {name!r} has open sizes {list(dims)}; give them in "
                             f"model.inputs, e.g. inputs: {{{name}: [1, ...]}}")
        shapes[name] = (None, *filled[1:])
    return shapes


def class_key(operation: Any) -> str:
    """The registry key of a layer: its class name; `ops.X` for a keras.ops operation (`x + y` is ops.Add)."""
    keras = import_keras()
    name = type(operation).__name__
    return name if isinstance(operation, keras.layers.Layer) else f"ops.{name}"


# ---------------------------------------------------------------- conversion


class _Walk:
    def __init__(self, builder: Builder):
        self.builder = builder
        self.values: dict[int, Value] = {}  # id(KerasTensor) -> its Value
        self.problems: list[str] = []

    def replace(self, obj: Any) -> Any:
        keras = import_keras()
        if isinstance(obj, keras.KerasTensor):
            return self.values[id(obj)]
        if isinstance(obj, (list, tuple)):
            return type(obj)(self.replace(item) for item in obj)
        if isinstance(obj, dict):
            return {key: self.replace(item) for key, item in obj.items()}
        return obj

    def stand_in(self, tensor: Any) -> Value:
        """A placeholder for the output of a layer that could not be converted, shaped as Keras says it is.

        The layers after it are still converted (into a graph that is never returned), so one run names
        every layer that cannot be."""
        name = self.builder.fresh(f"{self.builder.layer}/unconverted")
        self.builder.specs[name] = TensorSpec(name, (None, *tensor.shape[1:]))
        return Value(name, len(tensor.shape))

    def model(self, model: Any, inputs: list[Value], prefix: str) -> list[Value]:
        """Convert `model` applied to `inputs`; its output Values."""
        keras = import_keras()
        functional = _functional(model)
        for tensor, value in zip(functional.inputs, inputs):
            self.values[id(tensor)] = value
        for node in _operations(functional):
            operation = node.operation
            if isinstance(operation, keras.layers.InputLayer):
                continue
            self.builder.layer = f"{prefix}{operation.name}"
            try:
                outputs = self.layer(operation, node, prefix)
            except Unsupported as reason:
                self.problems.append(f"layer {self.builder.layer!r} ({class_key(operation)}): {reason}")
                outputs = [self.stand_in(tensor) for tensor in node.outputs]
            for tensor, value in zip(node.outputs, outputs):
                self.values[id(tensor)] = value
        return [self.values[id(tensor)] for tensor in functional.outputs]

    def layer(self, operation: Any, node: Any, prefix: str) -> list[Value]:
        keras = import_keras()
        inputs = [self.values[id(tensor)] for tensor in node.arguments.keras_tensors]
        if isinstance(operation, keras.Model):
            return self.model(operation, inputs, f"{prefix}{operation.name}/")
        converter = CONVERTERS.get(class_key(operation))
        if converter is None:
            raise Unsupported("no converter for this layer class")
        kwargs = {k: v for k, v in self.replace(node.arguments.kwargs).items() if k not in ("training", "mask")}
        self.builder.declared = converter.emits
        try:
            result = converter.convert(self.builder, Call(operation, inputs, self.replace(node.arguments.args),
                                                          kwargs))
        finally:
            self.builder.declared = None
        return [result] if isinstance(result, Value) else list(result)


def convert(model: Any, shapes: dict[str, Shape], progress: Progress) -> Graph:
    """The Graph computing `model` on inputs of `shapes` (Keras layout); UsageError naming every unsupported layer."""
    names = input_names(model)
    outputs = output_names(model)
    builder = Builder(set(names) | set(outputs))
    inputs = [TensorSpec(name, shapes[name]) for name in names]
    builder.specs.update((spec.name, spec) for spec in inputs)
    walk = _Walk(builder)
    results = walk.model(model, [Value(spec.name, len(spec.shape)) for spec in inputs], "")
    if walk.problems:
        raise UsageError(f"keras model {model.name!r}: {len(walk.problems)} layer(s) cannot be converted:\n  "
                         + "\n  ".join(walk.problems)
                         + f"\nsupported layers: {', '.join(CONVERTERS.names())}")
    builder.layer = "output"
    for name, value in zip(outputs, results):
        builder.emit("identity", [builder.keras_layout(value).name], output=name)
    progress.debug(f"converted keras model {model.name!r}: {len(builder.nodes)} nodes")
    return Graph(inputs=inputs, outputs=outputs, nodes=builder.nodes, constants=builder.constants)
