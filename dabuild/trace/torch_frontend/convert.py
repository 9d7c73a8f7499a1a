"""Walk a captured ATen graph and build the dabuild Graph, one converter call per ATen op.

Every fx node ends up in one of four states:

- a *tensor*: the name of a dabuild tensor (graph input or node output) that depends on the inputs;
- a *folded* value: a torch tensor or Python value computed right here, because
  everything it reads is known (parameters, buffers, constants, `t(weight)`);
- *symbolic* shape arithmetic on the batch size (`sym_size`, `mul` of SymInts),
  which converters read through torch's recorded shapes instead;
- *failed*: the converter rejected the node; everything downstream is skipped and
  all rejected nodes are reported together.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import fx

from dabuild.errors import BuildError, UsageError
from dabuild.ir.graph import Graph, Node, TensorSpec
from dabuild.ir.ops import OPS, ShapeError
from dabuild.names import unique_name
from dabuild.registry import Registry
from dabuild.trace.torch_frontend.capture import Capture, first_line, shape_text

Shape = tuple["int | None", ...]
Result = "str | list[str | None]"  # a converter's output: one tensor name, or one per output (None: unused)

INT64_MAX = 2**63 - 1


class Unsupported(Exception):
    """A node no converter can map; the reason is shown to the user next to the node."""


@dataclass
class Call:
    """One ATen call as a converter sees it: its node and its arguments by schema name, defaults filled in."""

    node: fx.Node
    args: dict[str, Any]

    @property
    def name(self) -> str:
        """The ATen op's packet name, e.g. `max_pool2d_with_indices`."""
        return op_name(self.node.target)

    def __getitem__(self, name: str) -> Any:
        return self.args[name]


def bind(node: fx.Node) -> Call:
    """The node's positional and keyword arguments matched to its ATen schema."""
    schema = node.target._schema  # type: ignore[union-attr]
    positional = [argument for argument in schema.arguments if not argument.kwarg_only]
    args = {argument.name: value for argument, value in zip(positional, node.args)}
    args.update(node.kwargs)
    for argument in schema.arguments:
        if argument.name not in args:
            args[argument.name] = argument.default_value if argument.has_default_value() else None
    return Call(node, args)


ConvertFunction = Callable[["Builder", Call], Any]


@dataclass(frozen=True)
class Converter:
    convert: ConvertFunction
    emits: tuple[str, ...] | None = None  # the IR ops it may emit (docs/ops.md's coverage); None = undeclared


CONVERTERS: Registry[Converter] = Registry("converter", "the torch frontend", ("dabuild.trace.torch_frontend.aten",),
                                            extra="torch")


def aten(*names: str, emits: tuple[str, ...] | None = None) -> Callable[[ConvertFunction], ConvertFunction]:
    """Register a converter for the ATen ops (overload packets) `names`; `emits` names the IR ops it may emit.

    The declaration feeds the coverage table and is held to: `Builder.emit` refuses an op it does not list.
    """
    def register(function: ConvertFunction) -> ConvertFunction:
        for name in names:
            CONVERTERS.add(name, Converter(function, emits))
        return function
    return register


def op_name(target: Any) -> str:
    """`conv2d` for torch.ops.aten.conv2d.default; the function's name for other call targets."""
    packet = getattr(target, "overloadpacket", None)
    return packet.__name__ if packet is not None else getattr(target, "__name__", str(target))


class Builder:
    """Collects the dabuild nodes and constants while the walk converts one fx node after another."""

    def __init__(self, capture: Capture, input_names: list[str]):
        self.capture = capture
        self.nodes: list[Node] = []
        self.constants: dict[str, np.ndarray] = {}
        self.shapes: dict[str, Shape] = {}
        self.dtypes: dict[str, str] = {}  # tensors of another element type than float32 (integer inputs)
        self.values: dict[fx.Node, Any] = {}  # tensor name(s) or folded value
        self.symbolic: set[fx.Node] = set()
        self.failed: dict[fx.Node, str] = {}  # node -> why it cannot be mapped ("" = no converter)
        self.skipped: set[fx.Node] = set()  # nodes downstream of a failed one
        self.input_names = input_names
        self.names = dict(capture.names)  # node -> state-dict key, also for values folded from one parameter
        self._constant_names: dict[tuple[tuple[int, ...], bytes], str] = {}
        self._used: set[str] = set(input_names)
        self.declared: tuple[str, ...] | None = None  # the IR ops the running converter says it emits
        self.scope: str | None = None  # the module path of the torch node being converted: its nodes' names
        self.batch = {
            size.node.expr
            for node in capture.inputs
            for size in node.meta["val"].shape[:1]
            if isinstance(size, torch.SymInt)
        }

    # ------------------------------------------------------------ shapes

    def dims(self, value: torch.Tensor) -> Shape:
        """A recorded (fake) tensor's shape in dabuild's terms: None for sizes that follow the batch."""
        return tuple(self.dim(size) for size in value.shape)

    def dim(self, size: int | torch.SymInt) -> int | None:
        if not isinstance(size, torch.SymInt):
            return int(size)
        if size.node.expr.free_symbols & self.batch:
            return None
        if size.node.hint is None:
            raise Unsupported(f"its size {size} depends on the data")
        return int(size.node.hint)

    def meta(self, node: fx.Node) -> Any:
        return node.meta["val"]

    def shape(self, name: str) -> Shape:
        return self.shapes[name]

    def size(self, name: str, axis: int) -> int:
        """The size of one axis, which the caller needs known (torch.export makes only the batch dynamic)."""
        size = self.shapes[name][axis]
        if size is None:
            raise Unsupported(f"axis {axis} of {name!r} has a dynamic size")
        return size

    # ------------------------------------------------------------ values

    def is_tensor(self, arg: Any) -> bool:
        """Whether `arg` depends on the model inputs (as opposed to a known value)."""
        return isinstance(arg, fx.Node) and isinstance(self.values.get(arg), (str, list))

    def value(self, arg: Any) -> Any:
        """The known value of an argument: folded nodes resolved, containers walked; Unsupported if dynamic."""
        if isinstance(arg, fx.Node):
            if arg in self.symbolic:
                raise Unsupported(f"it depends on the batch size through {arg.name}")
            if self.is_tensor(arg):
                raise Unsupported(f"it needs {arg.name} to be a constant")
            return self.values[arg]
        if isinstance(arg, (list, tuple)):
            return type(arg)(self.value(item) for item in arg)
        return arg

    def constant(self, arg: Any) -> np.ndarray | None:
        """`arg` as a float32 array if it is known (a folded tensor or a number), else None."""
        if self.is_tensor(arg) or (isinstance(arg, fx.Node) and arg in self.symbolic):
            return None
        value = self.value(arg)
        if isinstance(value, torch.Tensor):
            return value.detach().to(torch.float32).numpy()
        if isinstance(value, (int, float, bool)):
            return np.asarray(value, dtype=np.float32)
        raise Unsupported(f"cannot use {type(value).__name__} {value!r} as a tensor")

    def tensor(self, arg: Any) -> str:
        """The dabuild tensor name for an argument, making a constant of known values."""
        if self.is_tensor(arg):
            name = self.values[arg]
            if not isinstance(name, str):
                raise Unsupported(f"{arg.name} has several outputs; an element was expected")
            return name
        array = self.constant(arg)
        assert array is not None
        return self.add_constant(array, self.hint(arg))

    def hint(self, arg: Any) -> str:
        """A readable base name for a constant: its state-dict key, else the fx node's name."""
        if isinstance(arg, fx.Node):
            return self.names.get(arg, arg.name)
        return "scalar"

    def add_constant(self, array: np.ndarray, hint: str) -> str:
        """A float32 constant holding `array`; equal arrays share one constant."""
        array = np.ascontiguousarray(array, dtype=np.float32)
        key = (array.shape, array.tobytes())
        if key not in self._constant_names:
            name = self.fresh(hint)
            self.constants[name] = array
            self.shapes[name] = tuple(array.shape)
            self._constant_names[key] = name
        return self._constant_names[key]

    def fresh(self, base: str) -> str:
        base = re.sub(r"[^A-Za-z0-9_.]", "_", base)
        return unique_name(base, self._used)

    # ------------------------------------------------------------ emitting

    def emit(self, op: str, inputs: list[str], attrs: dict[str, Any] | None = None, outputs: int = 1,
             hint: str | None = None) -> list[str]:
        """Append one dabuild node; its output names. Shapes are inferred (and so checked) at once."""
        attrs = attrs or {}
        implementation = OPS.get(op)
        if implementation is None:
            raise Unsupported(f"dabuild has no {op!r} op")
        if self.declared is not None and op not in self.declared:
            raise BuildError(f"torch frontend: a converter emits {op!r}, which it does not declare in `emits` "
                             f"({', '.join(self.declared) or 'nothing'}); docs/ops.md would be wrong")
        name = self.fresh(self.scope or hint or op)
        names = [name] if outputs == 1 else [self.fresh(f"{name}.{index}") for index in range(outputs)]
        try:
            implementation.check_arity(len(inputs))
            inferred = implementation.infer([TensorSpec(i, self.shapes[i], self.dtypes.get(i, "float32"))
                                             for i in inputs], attrs)
        except ShapeError as error:
            raise Unsupported(f"{op}: {error}") from None
        for output, (shape, dtype) in zip(names, inferred):
            self.shapes[output] = tuple(shape)
            if dtype != "float32":
                self.dtypes[output] = dtype
        self.nodes.append(Node(name, op, inputs, names, attrs))
        return names

    def emit1(self, op: str, inputs: list[str], attrs: dict[str, Any] | None = None, hint: str | None = None) -> str:
        return self.emit(op, inputs, attrs, hint=hint)[0]


# ---------------------------------------------------------------- the walk


def convert(capture: Capture, inputs: dict[str, Shape], origin: str) -> Graph:
    """The dabuild Graph of a Capture whose inputs are declared as `inputs`.

    UsageError if the declared inputs do not match the captured ones, or listing
    every node no converter maps.
    """
    builder = Builder(capture, list(inputs))
    if len(inputs) != len(capture.inputs):
        raise UsageError(f"{origin} takes {len(capture.inputs)} inputs; model.inputs declares {len(inputs)}")
    specs = []
    for (name, declared), node in zip(inputs.items(), capture.inputs):
        shape = builder.dims(builder.meta(node))
        if tuple(declared[1:]) != shape[1:] or len(declared) != len(shape):
            raise UsageError(f"{origin}: input {name} has shape {shape_text(shape)}; "
                             f"model.inputs declares {shape_text(declared)}")
        builder.values[node] = name
        builder.shapes[name] = shape
        integer = not builder.meta(node).dtype.is_floating_point
        if integer:
            builder.dtypes[name] = "int64"
        specs.append(TensorSpec(name, shape, "int64" if integer else "float32"))
    for node in capture.graph.nodes:
        if node.op in ("placeholder", "get_attr") and node in capture.tensors:
            builder.values[node] = capture.tensors[node]
        elif node.op == "call_function":
            _convert_call(builder, node)
    outputs = [_output(builder, node) for node in capture.outputs]
    if builder.failed:
        raise UsageError(_unsupported_message(builder.failed, origin))
    return Graph(specs, outputs, builder.nodes, builder.constants)


def _convert_call(builder: Builder, node: fx.Node) -> None:
    if not node.users:
        return  # assertions, and results nobody reads
    value = node.meta.get("val")
    if isinstance(value, (torch.SymInt, torch.SymBool, torch.SymFloat)):
        builder.symbolic.add(node)
        return
    readers = node.all_input_nodes
    if any(arg in builder.failed or arg in builder.skipped for arg in readers):
        if _has_converter(node):
            builder.skipped.add(node)  # reported at its cause
        else:
            builder.failed[node] = ""  # reported too, so one run names every missing op
        return
    try:
        if not any(builder.is_tensor(arg) for arg in readers):
            builder.values[node] = _fold(builder, node)
            return
        if node.target is operator.getitem:
            result = _getitem(builder, node)
        elif not _has_converter(node):
            raise Unsupported("")
        else:
            converter = CONVERTERS[op_name(node.target)]
            builder.declared = converter.emits
            builder.scope = module_path(node)
            result = converter.convert(builder, bind(node))
        _check_shapes(builder, node, result)
    except Unsupported as reason:
        builder.failed[node] = str(reason)
        return
    builder.values[node] = result


def _has_converter(node: fx.Node) -> bool:
    return node.target is operator.getitem or (
        isinstance(node.target, torch._ops.OpOverload) and op_name(node.target) in CONVERTERS
    )


def _fold(builder: Builder, node: fx.Node) -> Any:
    """Compute a node whose inputs are all known, with real torch tensors."""
    args = builder.value(tuple(node.args))
    kwargs = {key: builder.value(item) for key, item in node.kwargs.items()}
    named = {builder.names[arg] for arg in node.all_input_nodes if arg in builder.names}
    if len(named) == 1:
        builder.names[node] = named.pop()  # t(fc.weight) is still fc.weight to a reader
    try:
        with torch.no_grad():
            return node.target(*args, **kwargs)  # type: ignore[operator]
    except Exception as error:  # noqa: BLE001 - whatever the op raises on these constants
        raise Unsupported(f"computing it from constants failed: {first_line(error)}") from None


def _getitem(builder: Builder, node: fx.Node) -> str:
    source, index = node.args
    assert isinstance(source, fx.Node) and isinstance(index, int)  # getitem(node, i): an output of a node
    element = builder.values[source][index]
    if element is None:
        raise Unsupported(f"output {index} of {source.name} is not supported (only the first output is)")
    return element


def _check_shapes(builder: Builder, node: fx.Node, result: Any) -> None:
    """The shapes dabuild inferred must be the ones torch recorded; anything else is a converter bug."""
    value = builder.meta(node)
    pairs = zip(result, value) if isinstance(result, list) else [(result, value)]
    for name, recorded in pairs:
        if name is None:
            continue
        expected = builder.dims(recorded)
        if builder.shape(name) != expected:
            raise BuildError(
                f"torch frontend: node {node.name} ({node.target}) maps to shape {list(builder.shape(name))} "
                f"but torch computes {list(expected)}"
            )


def _output(builder: Builder, node: Any) -> str:
    """A graph output name; outputs that are inputs or constants get an identity node of their own."""
    if isinstance(node, fx.Node) and (node in builder.failed or node in builder.skipped):
        return ""
    if not isinstance(node, fx.Node) or not builder.is_tensor(node) or not isinstance(builder.values[node], str):
        raise UsageError(f"model output {node} is not a tensor computed from the model inputs")
    name = builder.tensor(node)
    if name in builder.constants or name in builder.input_names:
        return builder.emit1("identity", [name])
    return name


def _unsupported_message(failed: dict[fx.Node, str], origin: str) -> str:
    lines = [f"  {_node_label(node)}{': ' + reason if reason else ''}" for node, reason in failed.items()]
    supported = ", ".join(CONVERTERS.names())
    return (
        f"{origin}: {len(lines)} torch op{'s' if len(lines) != 1 else ''} cannot be mapped to dabuild ops:\n"
        + "\n".join(lines)
        + f"\nsupported ATen ops: {supported}"
    )


def module_path(node: fx.Node) -> str | None:
    """The path of the innermost module that ran `node` (`features.3.conv`), which names the dabuild nodes it
    becomes; a path that starts with a digit (an nn.Sequential's child) is prefixed with the module's class
    (`linear_0`). None at the root module: the op then names the node."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return None
    path, kind = list(stack.values())[-1]
    if not path:
        return None
    return f"{_class_name(kind).lower()}_{path}" if path[0].isdigit() else str(path)


def _class_name(kind: Any) -> str:
    """The class name of an nn_module_stack entry's module type (a qualified name or the class)."""
    return kind.rsplit(".", 1)[-1] if isinstance(kind, str) else getattr(kind, "__name__", str(kind))


def _node_label(node: fx.Node) -> str:
    """`aten.erf (node erf, module block.act, at model.py:12)`."""
    parts = [f"node {node.name}"]
    stack = node.meta.get("nn_module_stack") or {}
    if stack:
        path, kind = list(stack.values())[-1]
        parts.append(f"module {path or '<root>'} ({_class_name(kind)})")
    location = _user_frame(node.meta.get("stack_trace") or "")
    if location:
        parts.append(f"at {location}")
    target = node.target
    name = f"aten.{op_name(target)}" if isinstance(target, torch._ops.OpOverload) else op_name(target)
    return f"{name} ({', '.join(parts)})"


def _user_frame(stack_trace: str) -> str | None:
    """`file:line` of the innermost frame outside torch in an fx stack trace."""
    frames = re.findall(r'File "([^"]+)", line (\d+)', stack_trace)
    for filename, line in reversed(frames):
        if "site-packages" not in filename and "dist-packages" not in filename:
            return f"{filename}:{line}"
    return None


def normalize(axis: int, rank: int) -> int:
    return axis % rank if rank else 0


def expand(value: int | Sequence[int], count: int) -> list[int]:
    """torch's `int or list` arguments (kernel, stride, ...) as a list of `count` ints."""
    if isinstance(value, int):
        return [value] * count
    values = [int(v) for v in value]
    return values * count if len(values) == 1 else values
