"""The ONNX tracer plugin: an .onnx file (or an onnx.ModelProto) becomes a dabuild Graph.

Nodes are visited in the file's (topological) order. A node whose inputs are
all known at load time is evaluated on the spot (folding.py); any other node
goes to its converter (converters.py). Nodes that cannot be converted are
collected, and the conversion ends with one UsageError listing every one of
them, so a user learns all that is missing from a single run.

onnx is imported only when a model is actually loaded: listing this plugin's
suffixes must work without the `dabuild[onnx]` extra installed.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from dabuild.errors import BuildError, UsageError
from dabuild.ir.graph import Graph, TensorSpec
from dabuild.trace.base import Shape, TracerPlugin
from dabuild.trace.onnx_frontend.conversion import Conversion, Unsupported
from dabuild.trace.onnx_frontend.converters import CONVERTERS, SUPPORTED_OPS
from dabuild.trace.onnx_frontend.quantized import QUANTIZATION_OPS

if TYPE_CHECKING:
    from dabuild.trace.onnx_frontend.model_file import OnnxModel, OnnxNode


def _shape_text(dims: tuple[Any, ...] | list[Any]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


class OnnxTracer(TracerPlugin):
    """Frontend for ONNX models: a path to an .onnx file, or a loaded onnx.ModelProto."""

    suffixes: ClassVar[tuple[str, ...]] = (".onnx",)

    def __init__(self, model: Any, inputs: dict[str, Shape] | None = None):
        super().__init__(model, inputs)
        self._decoded: OnnxModel | None = None

    def onnx_model(self) -> OnnxModel:
        """The model read, validated and decoded (once)."""
        if self._decoded is None:
            try:
                import onnx

                from dabuild.trace.onnx_frontend.model_file import check_model, decode, read_model_file
            except ImportError as error:
                raise UsageError(f"the onnx frontend needs the onnx package ({error}): pip install 'dabuild[onnx]'") from None
            if isinstance(self.model, (str, Path)):
                where = str(self.model)
                proto = read_model_file(Path(self.model))
            elif isinstance(self.model, onnx.ModelProto):
                where = f"<ONNX model {self.model.graph.name or 'without a name'}>"
                check_model(self.model, where)
                proto = self.model
            else:
                raise UsageError(f"the onnx frontend reads .onnx files or onnx.ModelProto, got a {type(self.model).__name__}")
            self._decoded = decode(proto, where)
        return self._decoded

    def get_input_shapes(self) -> dict[str, Shape]:
        """Shapes from the graph inputs; model.inputs fills sizes the file leaves open and must agree with the rest.

        A leading axis the file leaves open is the dynamic batch (None), whatever
        example size the recipe gives it; so is a leading 1 (QONNX and Brevitas
        files fix the batch at 1) where model.inputs gives null.
        """
        model = self.onnx_model()
        declared = self.inputs or {}
        names = [graph_input.name for graph_input in model.inputs]
        unknown = sorted(set(declared) - set(names))
        if unknown:
            listing = ", ".join(f"{i.name} {_shape_text(i.dims or ())}" for i in model.inputs)
            raise UsageError(
                f"{model.where}: model.inputs names {', '.join(map(repr, unknown))}, "
                f"which the model does not take; its inputs: {listing}"
            )
        shapes: dict[str, Shape] = {}
        for graph_input in model.inputs:
            wanted = declared.get(graph_input.name)
            dims = graph_input.dims
            if dims is None:
                if wanted is None:
                    raise UsageError(
                        f"{model.where}: input {graph_input.name!r} has no shape in the model; "
                        f"give it in model.inputs, e.g. inputs: {{{graph_input.name}: [1, 3, 224, 224]}}"
                    )
                dims = (None,) * len(wanted)
            mismatch = wanted is not None and (
                len(wanted) != len(dims)
                or any(isinstance(d, int) and w is not None and w != d for d, w in zip(dims, wanted))
            )
            if mismatch:
                raise UsageError(
                    f"{model.where}: input {graph_input.name!r} has shape {_shape_text(dims)} in the model, "
                    f"but model.inputs gives {_shape_text(wanted)}"
                )
            shapes[graph_input.name] = tuple(
                None if axis == 0 and d == 1 and wanted is not None and wanted[0] is None  # asked: batch 1 -> any
                else d if isinstance(d, int) else None if axis == 0 or wanted is None else wanted[axis]
                for axis, d in enumerate(dims)
            )
        return shapes

    def apply_model(self, inputs: dict[str, TensorSpec]) -> Conversion:
        """Convert every node over the given input specs; UsageError listing all unsupported nodes."""
        from dabuild.trace.onnx_frontend.folding import DependsOnBatch, evaluate

        model = self.onnx_model()
        taken = {name for node in model.nodes for name in (*node.inputs, *node.outputs, node.label)}
        ctx = Conversion(model.where, model.opset, taken | set(inputs) | set(model.initializers))
        ctx.specs.update(inputs)
        ctx.known.update(model.initializers)
        problems: list[str] = []
        blocked: set[str] = set()  # outputs of nodes that could not be converted
        for node in model.nodes:
            present = [name for name in node.inputs if name]
            converter = CONVERTERS.get(node.kind)
            if blocked.intersection(present):
                if converter is None:
                    problems.append(f"node {node.label!r} ({node.kind}): no converter for {node.kind}")
                blocked.update(node.outputs)
                continue
            try:
                if (node.domain in ("", "ai.onnx") and node.kind not in QUANTIZATION_OPS
                        and all(name in ctx.known for name in present)):
                    values = evaluate(node, [ctx.known.get(name) if name else None for name in node.inputs], ctx.opset)
                    for name, value in zip(node.outputs, values):
                        ctx.bind(name, value)
                elif converter is None:
                    raise Unsupported(f"no converter for {node.kind}")
                else:
                    converter.convert(ctx, node)
            except (Unsupported, DependsOnBatch) as reason:
                problems.append(f"node {node.label!r} ({node.kind}): {reason}")
                blocked.update(node.outputs)
            except (BuildError, UsageError):
                raise
            except Exception as error:  # the reference evaluator rejecting a load-time computation
                raise BuildError(
                    f"{model.where}: node {node.label!r} ({node.kind}): cannot evaluate it while loading: "
                    f"{type(error).__name__}: {error}"
                ) from error
        if problems:
            raise UsageError(
                f"{model.where}: {len(problems)} node(s) cannot be converted:\n  "
                + "\n  ".join(problems)
                + f"\nsupported ops: {', '.join(SUPPORTED_OPS)}"
            )
        return ctx

    def trace(self) -> Graph:
        model = self.onnx_model()
        shapes = self.get_input_shapes()
        for graph_input in model.inputs:
            if graph_input.dtype is not None and graph_input.dtype.kind != "f":
                raise UsageError(
                    f"{model.where}: input {graph_input.name!r} has element type {graph_input.dtype}; "
                    "dabuild graphs take float inputs"
                )
        specs = {name: TensorSpec(name, shape) for name, shape in shapes.items()}
        ctx = self.apply_model(specs)
        for name in model.outputs:
            if name in ctx.quantized:
                raise UsageError(f"{model.where}: graph output {name!r} is an integer tensor (quantized); dabuild "
                                 "graphs give real values: end the model with DequantizeLinear")
            try:
                ctx.materialize(name)
            except Unsupported as reason:
                raise UsageError(f"{model.where}: graph output {name!r}: {reason}") from None
        return Graph(inputs=list(specs.values()), outputs=list(model.outputs), nodes=ctx.nodes, constants=ctx.constants)
