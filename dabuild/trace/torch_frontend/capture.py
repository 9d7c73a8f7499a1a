"""Capture a torch model as one ATen-level fx graph, whatever way torch can produce it.

`torch.export` is the preferred capture: it keeps the batch axis symbolic
(a `torch.export.Dim`) and records ops such as `linear` or `hardswish` whole.
Where export refuses a model (for example code that bounds the batch size, so
the dynamic batch violates a constraint), `torch.fx.symbolic_trace` records
the forward pass as Python-level calls, and `make_fx` lowers that straight-line
program to ATen with a symbolic batch. Either way the result is a `Capture`:
an fx graph whose placeholders are the user inputs or known tensors.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import logging
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import fx

from dabuild.errors import BuildError, UsageError
from dabuild.progress import Progress

Shape = tuple["int | None", ...]


@dataclass
class Capture:
    """An ATen graph and the tensors (parameters, buffers, lifted constants) its placeholders stand for."""

    graph: fx.Graph
    inputs: list[fx.Node]  # the user-input placeholders, in the model's argument order
    outputs: list[fx.Node]  # the user outputs, flattened
    tensors: dict[fx.Node, torch.Tensor]  # placeholder or get_attr node -> its value
    names: dict[fx.Node, str] = field(default_factory=dict)  # node -> state-dict key, for readable constants
    how: str = "torch.export"


def first_line(error: BaseException) -> str:
    """The first non-empty line of an error message: torch's errors run to pages."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0] if lines else '(no message)'}"


def shape_text(shape: Shape) -> str:
    """`[?, 3, 32, 32]`: a shape as the user reads it, ? marking the dynamic batch."""
    return "[" + ", ".join("?" if size is None else str(size) for size in shape) + "]"


def describe(model: Any) -> str:
    """`Net (defined in /path/model.py)` or `torch.nn.modules.container.Sequential`: the model in errors."""
    target = model.function if isinstance(model, FunctionModule) else model
    subject = target if inspect.isfunction(target) or inspect.isclass(target) else type(target)
    try:
        source = inspect.getsourcefile(subject)
    except TypeError:
        source = None
    if subject.__module__.split(".")[0] == "torch" or source is None:
        return f"{subject.__module__}.{subject.__qualname__}"
    return f"{subject.__qualname__} (defined in {source})"


class FunctionModule(torch.nn.Module):
    """A plain function of tensors as a module, since torch.export captures modules only."""

    def __init__(self, function: Callable[..., Any]):
        super().__init__()
        self.function = function

    def forward(self, *inputs: torch.Tensor) -> Any:
        return self.function(*inputs)


def as_module(model: Any) -> torch.nn.Module:
    """The module to capture: `model` itself, what a factory taking no arguments builds, or a function wrapped."""
    if isinstance(model, torch.nn.Module):
        return model
    if not callable(model):
        raise UsageError(f"the torch frontend traces nn.Modules and functions of tensors; got a {type(model).__name__}")
    if not _takes_arguments(model):
        try:
            built = model()
        except Exception as error:
            raise BuildError(f"{describe(model)}() raised {first_line(error)}") from error
        if not isinstance(built, torch.nn.Module):
            raise UsageError(f"{describe(model)}() returned a {type(built).__name__}, not a torch.nn.Module")
        return built
    return FunctionModule(model)


def _takes_arguments(function: Callable[..., Any]) -> bool:
    """Whether calling `function()` would miss a required argument: a factory takes none, a model its inputs."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return True
    required = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return any(p.default is inspect.Parameter.empty and p.kind in required for p in parameters)


@contextlib.contextmanager
def quiet_torch() -> Iterator[None]:
    """Silence torch's warnings, log records and stderr dumps of generated code while it traces.

    They are about torch's internals, not the model; failures still surface as
    exceptions, and dabuild reports their first line. The stderr and warning
    filters are process-wide: safe because trace is the first stage of a build
    and nothing else runs beside it.
    """
    logger = logging.getLogger("torch")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


@contextlib.contextmanager
def eval_mode(module: torch.nn.Module) -> Iterator[None]:
    """The module in eval mode (dropout off, batch norm on running statistics), restored afterwards."""
    was_training = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was_training)


def example_batch(shapes: dict[str, Shape]) -> int:
    """A batch size for the example inputs that equals no other input size.

    Symbolic tracing gives equal input sizes one symbol, so a batch of 4 next to
    4 channels would make the channel axis look dynamic too; 0 and 1 are
    specialised by torch and never stay symbolic.
    """
    taken = {size for shape in shapes.values() for size in shape if size is not None}
    return next(n for n in range(2, 1 << 16) if n not in taken)


def example_inputs(shapes: dict[str, Shape], batch: int, dtypes: dict[str, str] | None = None) -> list[torch.Tensor]:
    """Random float inputs; zeros for the integer ones (`dtypes`), a valid index into any embedding table."""
    generator = torch.Generator().manual_seed(0)
    integer = dtypes or {}
    return [torch.zeros((batch, *sample_sizes(name, shape)), dtype=getattr(torch, integer[name])) if name in integer
            else torch.randn((batch, *sample_sizes(name, shape)), generator=generator)
            for name, shape in shapes.items()]


def sample_sizes(name: str, shape: Shape) -> tuple[int, ...]:
    """An input's sizes but the batch, which an example input needs known."""
    sizes = tuple(d for d in shape[1:] if d is not None)
    if len(sizes) < len(shape) - 1:
        raise UsageError(f"input {name!r} has shape {shape_text(shape)}: give every size but the batch in "
                         "model.inputs")
    return sizes


def _refuse_wide_floats(model: torch.nn.Module) -> None:
    """UsageError for a module holding float64 parameters or buffers: dabuild computes in float32, which would
    change what it computes (inf where the float64 answer is finite, lost digits), so it is never done silently."""
    wide = [(name, tensor.dtype) for name, tensor in (*model.named_parameters(), *model.named_buffers())
            if tensor.is_floating_point() and tensor.dtype.itemsize > 4]
    if wide:
        names = ", ".join(name for name, _ in wide[:3]) + (", ..." if len(wide) > 3 else "")
        raise UsageError(f"{describe(model)} computes in {wide[0][1]} ({names}); dabuild computes in float32, "
                         "which would change its results: convert it with model.float()")


def capture_module(
    model: torch.nn.Module, shapes: dict[str, Shape], known: Callable[[Any], bool], progress: Progress,
    dtypes: dict[str, str] | None = None,
) -> Capture:
    """`model` (in eval mode) as an ATen graph with a dynamic batch: export first, fx if export fails.

    `known` tells which ATen ops the caller maps, so export decomposes only the others.
    """
    _refuse_wide_floats(model)
    batch = example_batch(shapes)
    examples = example_inputs(shapes, batch, dtypes)
    try:
        with quiet_torch():
            program = torch.export.export(model, tuple(examples), dynamic_shapes=_dynamic_batch(model, len(examples)))
    except Exception as export_error:  # noqa: BLE001 - torch raises many unrelated types here
        progress.debug(f"torch.export failed ({first_line(export_error)}); falling back to torch.fx.symbolic_trace")
        try:
            with quiet_torch():
                return _capture_with_fx(model, examples)
        except Exception as fx_error:  # noqa: BLE001 - as above; both failures are reported
            inputs = ", ".join(f"{name}{shape_text(shape)}" for name, shape in shapes.items())
            raise BuildError(
                f"{describe(model)} with inputs {inputs} cannot be captured: "
                f"torch.export failed with {first_line(export_error)}; "
                f"torch.fx.symbolic_trace failed with {first_line(fx_error)}"
            ) from export_error
    return capture_program(program, known)


def _dynamic_batch(model: torch.nn.Module, count: int) -> tuple[Any, ...]:
    """Axis 0 of every input is the one `batch` dimension (FunctionModule takes its inputs as *args)."""
    batch = torch.export.Dim("batch")
    specs = tuple({0: batch} for _ in range(count))
    return (specs,) if isinstance(model, FunctionModule) else specs


def capture_program(program: torch.export.ExportedProgram, known: Callable[[Any], bool] | None = None) -> Capture:
    """The Capture of an ExportedProgram, decomposed to core ATen if it calls ops `known` rejects.

    Without `known` the program is taken as it is. With it, any tensor op that
    `known` rejects makes us run the default decompositions once, sparing the
    ops `known` accepts: `linear` stays whole while an unknown op may lower to
    known ones.
    """
    if known is not None and any(is_tensor_op(node) and not known(node.target) for node in program.graph.nodes):
        table = torch.export.default_decompositions()
        for op in list(table.keys()):
            if known(op):
                del table[op]
        with quiet_torch():
            program = program.run_decompositions(table)
    return _from_program(program)


def is_tensor_op(node: fx.Node) -> bool:
    """A call of an ATen op that computes tensors (not shape arithmetic, not an assertion)."""
    value = node.meta.get("val")
    values = value if isinstance(value, (list, tuple)) else [value]
    return (
        node.op == "call_function"
        and isinstance(node.target, torch._ops.OpOverload)
        and any(isinstance(v, torch.Tensor) for v in values)
    )


def _from_program(program: torch.export.ExportedProgram) -> Capture:
    from torch.export.graph_signature import InputKind, OutputKind

    placeholders = {node.name: node for node in program.graph.nodes if node.op == "placeholder"}
    inputs: list[fx.Node] = []
    tensors: dict[fx.Node, torch.Tensor] = {}
    names: dict[fx.Node, str] = {}
    for spec in program.graph_signature.input_specs:
        node = placeholders[spec.arg.name]
        if spec.kind == InputKind.USER_INPUT:
            inputs.append(node)
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            source = program.state_dict if spec.target in program.state_dict else program.constants
            tensors[node] = source[spec.target]
            names[node] = spec.target
        else:
            raise UsageError(f"the exported program has a {spec.kind.name.lower()} input {spec.arg.name!r}, "
                             "which dabuild cannot represent")
    (output,) = [node for node in program.graph.nodes if node.op == "output"]
    results = list(_flatten(output.args[0]))
    kinds = [spec.kind for spec in program.graph_signature.output_specs]
    outputs = [node for node, kind in zip(results, kinds) if kind == OutputKind.USER_OUTPUT]
    return Capture(program.graph, inputs, outputs, tensors, names, "torch.export")


def _capture_with_fx(model: torch.nn.Module, examples: list[torch.Tensor]) -> Capture:
    """symbolic_trace, then make_fx with a symbolic batch; parameters stay real tensors (get_attr nodes)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    traced = fx.symbolic_trace(model)
    lowered = make_fx(traced, tracing_mode="symbolic", _allow_non_fake_inputs=True)(*examples)
    keys = {id(tensor): key for key, tensor in _state(traced).items()}
    tensors = _attributes(lowered)
    (output,) = [node for node in lowered.graph.nodes if node.op == "output"]
    return Capture(
        lowered.graph,
        [node for node in lowered.graph.nodes if node.op == "placeholder"],
        list(_flatten(output.args[0])),
        tensors,
        {node: keys[id(tensor)] for node, tensor in tensors.items() if id(tensor) in keys},
        "torch.fx",
    )


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(model.named_parameters()), **dict(model.named_buffers())}


def _attributes(module: fx.GraphModule) -> dict[fx.Node, torch.Tensor]:
    """Tensors that get_attr nodes read (constants make_fx lifted out of the code)."""
    found: dict[fx.Node, torch.Tensor] = {}
    for node in module.graph.nodes:
        if node.op == "get_attr":
            value: Any = module
            for part in str(node.target).split("."):
                value = getattr(value, part)
            if isinstance(value, torch.Tensor):
                found[node] = value
    return found


def _flatten(value: Any) -> Sequence[Any]:
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _flatten(item)]
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _flatten(item)]
    return [value]


def load_archive(path: Path) -> torch.export.ExportedProgram:
    """A `torch.export.save` archive (.pt2), vetted first so it cannot run code (archive.py); UsageError naming
    the file if it is refused or torch cannot read it."""
    from dabuild.trace.torch_frontend.archive import read_vetted

    data = read_vetted(path)
    try:
        return torch.export.load(io.BytesIO(data))
    except Exception as error:  # noqa: BLE001 - zip, json and pickle errors alike
        raise UsageError(f"{path}: not a readable torch.export archive: {first_line(error)}") from None
