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

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from dabuild.errors import BuildError, UsageError
from dabuild.ir.graph import Graph, TensorSpec
from dabuild.ir.ops import OPS
from dabuild.limits import check_constant_size
from dabuild.registry import Registry
from dabuild.trace.base import Shape, TracerPlugin, check_integer_inputs
from dabuild.trace.onnx_frontend.conversion import Conversion, Unsupported
from dabuild.trace.onnx_frontend.converters import CONVERTERS, SUPPORTED_OPS
from dabuild.trace.onnx_frontend.quantized import QUANTIZATION_OPS
from dabuild.trace.stacked_batch import stack_batch

if TYPE_CHECKING:
    from dabuild.trace.onnx_frontend.model_file import OnnxModel


def _shape_text(dims: tuple[Any, ...] | list[Any]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


class OnnxTracer(TracerPlugin):
    """Frontend for ONNX models: a path to an .onnx file, or a loaded onnx.ModelProto."""

    suffixes: ClassVar[tuple[str, ...]] = (".onnx",)

    @classmethod
    def converters(cls) -> Registry[Any]:
        return CONVERTERS

    @classmethod
    def side_files(cls, model_file: Path) -> list[Path]:
        """The external data files beside the model (torch writes `model.onnx.data` for large models)."""
        try:
            from dabuild.trace.onnx_frontend.model_file import external_data_locations
        except ImportError:  # onnx missing: tracing says which package to install
            return []
        return [model_file.parent / location for location in external_data_locations(model_file)]

    def __init__(self, model: Any, inputs: dict[str, Shape] | None = None):
        super().__init__(model, inputs)
        self._decoded: OnnxModel | None = None

    def onnx_model(self) -> OnnxModel:
        """The model read, validated and decoded (once)."""
        if self._decoded is None:
            try:
                import onnx

                from dabuild.trace.onnx_frontend.model_file import check_model, decode, read_model_file, upgrade
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
            proto, note = upgrade(proto, where)
            if note:
                self.progress.info(note)
            self._decoded = decode(proto, where)
        return self._decoded

    def get_input_shapes(self) -> dict[str, Shape]:
        """Shapes from the graph inputs; model.inputs fills sizes the file leaves open and must agree with the rest.

        A leading axis the file leaves open is the dynamic batch (None), whatever
        example size the recipe gives it. A fixed leading 1 (nearly every published
        file, QONNX and Brevitas exports) is relaxed later, in `apply_model`, where
        the graph allows it.
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
            if mismatch and wanted is not None:
                raise UsageError(
                    f"{model.where}: input {graph_input.name!r} has shape {_shape_text(dims)} in the model, "
                    f"but model.inputs gives {_shape_text(wanted)}"
                )
            shapes[graph_input.name] = tuple(
                d if isinstance(d, int) else None if axis == 0 or wanted is None else wanted[axis]
                for axis, d in enumerate(dims)
            )
        return shapes

    def apply_model(self, inputs: dict[str, TensorSpec], relaxed_batch: bool = False) -> Conversion:
        """Convert every node over the given input specs; UsageError listing all unsupported nodes."""
        from dabuild.trace.onnx_frontend.folding import DependsOnBatch, evaluate, output_elements

        model = self.onnx_model()
        tensors = {name for node in model.nodes for name in (*node.inputs, *node.outputs)}
        tensors |= set(inputs) | set(model.initializers)
        labels = frozenset(node.label for node in model.nodes) - tensors
        ctx = Conversion(model.where, model.opset, tensors | labels, labels)
        ctx.relaxed_batch = relaxed_batch
        ctx.read = {name for node in model.nodes for name in node.inputs} | set(model.outputs)
        ctx.specs.update(inputs)
        ctx.known.update(model.initializers)
        problems: list[tuple[str, str]] = []  # (op, line), every node listed under its op
        blocked: set[str] = set()  # outputs of nodes that could not be converted
        for node in model.nodes:
            present = [name for name in node.inputs if name]
            converter = CONVERTERS.get(node.kind)
            if blocked.intersection(present):
                if converter is None:
                    problems.append((node.kind, f"node {node.label!r} ({node.kind}): no converter for {node.kind}"))
                blocked.update(node.outputs)
                continue
            try:
                if (node.domain in ("", "ai.onnx") and node.kind not in QUANTIZATION_OPS
                        and all(name in ctx.known for name in present)):
                    known = [ctx.known.get(name) if name else None for name in node.inputs]
                    check_constant_size(model.where, node, output_elements(node, known))
                    values = evaluate(node, known, ctx.opset)
                    for name, value in zip(node.outputs, values):
                        ctx.bind(name, value)
                elif converter is None:
                    raise Unsupported(f"no converter for {node.kind}")
                else:
                    ctx.declared = converter.emits
                    converter.convert(ctx, node)
            except (Unsupported, DependsOnBatch) as reason:
                problems.append((node.kind, f"node {node.label!r} ({node.kind}): {reason}"))
                blocked.update(node.outputs)
            except (BuildError, UsageError):
                raise
            except Exception as error:  # the reference evaluator rejecting a load-time computation
                raise BuildError(
                    f"{model.where}: node {node.label!r} ({node.kind}): cannot evaluate it while loading: "
                    f"{type(error).__name__}: {error}"
                ) from error
        if problems:
            kinds = Counter(kind for kind, _ in problems)
            summary = ", ".join(f"{kind} ({count} node{'s' if count > 1 else ''})" for kind, count in kinds.items())
            raise UsageError(
                f"{model.where}: {len(problems)} node(s) cannot be converted; ops: {summary}\n  "
                + "\n  ".join(line for _, line in sorted(problems, key=lambda problem: problem[0]))
                + f"\nsupported ops: {', '.join(SUPPORTED_OPS)}"
            )
        return ctx

    def trace(self) -> Graph:
        model = self.onnx_model()
        shapes = self.get_input_shapes()
        for graph_input in model.inputs:
            if graph_input.dtype is not None and graph_input.dtype.kind not in "fiub":
                raise UsageError(
                    f"{model.where}: input {graph_input.name!r} has element type {graph_input.dtype}; "
                    "dabuild graphs take float inputs (and integer ones that index embedding tables or feed only shape "
                    "computations)"
                )
            if graph_input.dtype is not None and graph_input.dtype.kind == "f" and graph_input.dtype.itemsize > 4:
                raise UsageError(
                    f"{model.where}: input {graph_input.name!r} is {graph_input.dtype}: the model computes in "
                    f"{graph_input.dtype}, and dabuild computes in float32, which would change its results "
                    "(overflow to inf, lost precision); export the model in float32 (torch: model.float())"
                )
        indices = {node.inputs[1] for node in model.nodes if node.kind == "Gather"}
        shape_only = [graph_input for graph_input in model.inputs if graph_input.dtype is not None
                      and graph_input.dtype.kind != "f" and graph_input.name not in indices]
        for graph_input in shape_only:
            self.progress.info(f"{model.where}: input {graph_input.name!r} ({graph_input.dtype}) feeds only shape "
                               "computations, which loading evaluates; the graph does not take it")
        declared = self.inputs or {}
        fixed = [name for name, shape in shapes.items() if shape and shape[0] == 1]
        asked = [name for name in fixed if name in declared and declared[name] and declared[name][0] is None]
        relaxable = [name for name in fixed if name not in declared or name in asked]
        if relaxable and len(relaxable) == len(fixed):
            relaxed = {name: (None, *shape[1:]) if name in relaxable else shape for name, shape in shapes.items()}
            graph, why_not = self._relaxed(relaxed)
            if graph is not None:
                self.progress.info(f"{model.where}: the file fixes the batch of {', '.join(map(repr, relaxable))} "
                                   "to 1; relaxed to any batch (every node treats samples independently)")
                return graph
            one_sample = self._convert(shapes)
            try:
                graph = stack_batch(one_sample)
            except BuildError as error:
                why_not = f"{why_not}; stacking samples: {error}"
            else:
                self.progress.info(f"{model.where}: the file fixes the batch of {', '.join(map(repr, relaxable))} "
                                   f"to 1 and moves it ({why_not}); relaxed to any batch by stacking samples "
                                   "(checked against one sample at a time)")
                return graph
            if asked:
                raise UsageError(f"{model.where}: model.inputs gives {', '.join(map(repr, asked))} a free batch "
                                 f"(null), but the graph cannot take one: {why_not}")
            self.progress.info(f"{model.where}: the file fixes the batch to 1 and the graph cannot relax it "
                               f"({why_not}); it runs sample by sample")
            return one_sample
        return self._convert(shapes)

    def _relaxed(self, shapes: dict[str, Shape]) -> tuple[Graph | None, str]:
        """The graph over a free batch, or None and why the file's fixed batch of 1 has to stay."""
        try:
            graph = self._convert(shapes, relaxed_batch=True)
            outputs = graph.tensor_shapes()
        except (UsageError, BuildError) as error:
            lines = str(error).splitlines()
            return None, lines[1].strip() if len(lines) > 1 else lines[0]  # the first node listed, if any
        varying = {spec.name for spec in graph.inputs}  # tensors that depend on an input (constants never mix)
        mixing = []
        for node in graph.nodes:
            if varying.intersection(node.inputs):
                varying.update(node.outputs)
                if not OPS[node.op].samplewise(node.attrs):
                    mixing.append(f"{node.name} ({node.op})")
        if mixing:
            return None, f"node {mixing[0]} mixes samples"
        pinned = [name for name in graph.outputs if not outputs[name].shape or outputs[name].shape[0] is not None]
        if pinned:
            return None, f"output {pinned[0]!r} has no batch axis first"
        return graph, ""

    def _convert(self, shapes: dict[str, Shape], relaxed_batch: bool = False) -> Graph:
        model = self.onnx_model()
        integer = {graph_input.name: graph_input.dtype for graph_input in model.inputs
                   if graph_input.dtype is not None and graph_input.dtype.kind != "f"}
        specs = {name: TensorSpec(name, shape, "int64" if name in integer else "float32")
                 for name, shape in shapes.items()}
        ctx = self.apply_model(specs, relaxed_batch)
        for name in model.outputs:
            if name in ctx.quantized:
                raise UsageError(f"{model.where}: graph output {name!r} is an integer tensor (quantized); dabuild "
                                 "graphs give real values: end the model with DequantizeLinear")
            try:
                ctx.materialize(name)
            except Unsupported as reason:
                raise UsageError(f"{model.where}: graph output {name!r}: {reason}") from None
        read = {name for node in ctx.nodes for name in node.inputs} | set(model.outputs)
        graph = Graph(inputs=[spec for name, spec in specs.items() if name not in integer or name in read],
                      outputs=list(model.outputs), nodes=ctx.nodes, constants=ctx.constants)
        try:
            check_integer_inputs(graph, {})  # the file states its own types; trace_model checks model.inputs
        except UsageError as error:
            raise UsageError(f"{model.where}: {error}") from None
        return graph
