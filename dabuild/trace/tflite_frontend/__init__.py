"""The TFLite (LiteRT) tracer plugin: a .tflite file becomes a dabuild Graph, its quantization given.

Read without TensorFlow (model_file.py), converted operator by operator in the
file's order (converters.py) over a Conversion (conversion.py, which says how
layouts and the file's quantization map onto the graph). Before anything is
converted, every operator of a builtin dabuild has no converter for (and every
custom operator) is listed with the indices of the operators using it, in one
UsageError; an option a converter cannot represent is refused naming the file,
the operator's index and name.

A quantized model input (int8 or int16) becomes a float input behind a
fake_quant with the file's scale and zero point: the graph takes real values,
quantized at the input as the file states.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from dabuild.errors import BuildError, UsageError
from dabuild.ir.given_quant import check_given
from dabuild.ir.graph import Graph, TensorSpec
from dabuild.ir.passes import check_shapes
from dabuild.trace.base import Shape, TracerPlugin
from dabuild.trace.tflite_frontend.conversion import TO_NCHW, Conversion, Unsupported
from dabuild.trace.tflite_frontend.converters import CONVERTERS
from dabuild.trace.tflite_frontend.model_file import enum_names, listed, read_model, schema, tensor_name


def operator_names(model: Any) -> list[str]:
    """The builtin (or custom) name of each operator of the first subgraph, in order."""
    builtins = enum_names(schema().BuiltinOperator)
    codes = listed(model.operatorCodes)
    names = []
    for op in listed(model.subgraphs[0].operators):
        if not 0 <= op.opcodeIndex < len(codes):
            names.append(f"opcode {op.opcodeIndex} (out of range)")
            continue
        code = codes[op.opcodeIndex]
        builtin = max(int(code.builtinCode), int(code.deprecatedBuiltinCode))
        name = builtins.get(builtin, f"builtin {builtin}")
        if name == "CUSTOM":
            custom = code.customCode.decode("utf-8", "replace") if isinstance(code.customCode, bytes) \
                else str(code.customCode)
            name = f"CUSTOM {custom!r}"
        names.append(name)
    return names


MALFORMED = (AttributeError, TypeError, ValueError, IndexError, KeyError, OverflowError)


class TfliteTracer(TracerPlugin):
    """Frontend for TFLite flatbuffers (.tflite): float32, int8 and 16x8 models."""

    suffixes: ClassVar[tuple[str, ...]] = (".tflite",)

    def __init__(self, model: Any, inputs: dict[str, Shape] | None = None):
        super().__init__(model, inputs)
        if not isinstance(model, (str, Path)):
            raise UsageError(f"the tflite frontend reads .tflite files, got a {type(model).__name__}")
        self.path = Path(model)
        self._model: Any = None

    def flatbuffer(self) -> Any:
        if self._model is None:
            self._model = read_model(self.path)
        return self._model

    def get_input_shapes(self) -> dict[str, Shape]:
        model = self.flatbuffer()
        graph = model.subgraphs[0]
        shapes: dict[str, Shape] = {}
        tensors = listed(graph.tensors)
        for index in listed(graph.inputs):
            if not 0 <= index < len(tensors):
                raise UsageError(f"{self.path}: model input tensor {index} is out of range (the subgraph has "
                                 f"{len(tensors)})")
            tensor = tensors[index]
            shape = tuple(int(d) for d in (tensor.shape if tensor.shape is not None else ()))
            shapes[tensor_name(tensor)] = (None, *shape[1:]) if shape else ()
        return shapes

    def apply_model(self, inputs: dict[str, Any]) -> Conversion:
        model = self.flatbuffer()
        where = str(self.path)
        if len(model.subgraphs) > 1:
            raise UsageError(f"{where}: {len(model.subgraphs)} subgraphs (control flow); dabuild reads models of one")
        names = operator_names(model)
        refused: dict[str, list[int]] = {}
        for index, name in enumerate(names):
            if name not in CONVERTERS.names():
                refused.setdefault(name, []).append(index)
        if refused:
            lines = [f"  {name}: operator{'s' if len(found) > 1 else ''} {', '.join(map(str, found))}"
                     for name, found in refused.items()]
            raise UsageError(f"{where}: operators dabuild cannot read (it reads {', '.join(sorted(CONVERTERS.names()))}):\n"
                             + "\n".join(lines))
        ctx = Conversion(model, where)
        try:
            for index in listed(ctx.graph.inputs):
                name = tensor_name(ctx.tensor(index))
                ctx.fresh(name)
                ctx.label = name
                name = ctx.quantized(index, name)   # before the transpose: the graph input carries the file's params
                ctx.inputs[index] = name
                if len(ctx.shape(index)) == 4:
                    name = ctx.emit("transpose", [name], {"perm": TO_NCHW}, nchw=True)
                ctx.names[index] = name
        except Unsupported as error:
            raise UsageError(f"{where}: model input: {error}") from None
        for index, (op, name) in enumerate(zip(listed(ctx.graph.operators), names)):
            ctx.label = f"op{index}_{name.lower()}"
            try:
                CONVERTERS[name](ctx, op)
            except Unsupported as error:
                raise UsageError(f"{where}: operator {index} ({name}): {error}") from None
            except MALFORMED as error:  # options or tensors missing or of the wrong kind in a corrupt file
                raise UsageError(f"{where}: operator {index} ({name}): malformed operator "
                                 f"({type(error).__name__}: {error})") from None
        return ctx

    def trace(self) -> Graph:
        shapes = self.get_input_shapes()
        ctx = self.apply_model(shapes)
        ctx.label = "output"
        try:
            outputs = [ctx.nhwc(index) for index in listed(ctx.graph.outputs)]
        except Unsupported as error:
            raise UsageError(f"{self.path}: model output: {error}") from None
        specs = [TensorSpec(name, shape) for name, shape in shapes.items()]
        graph = Graph(specs, outputs, ctx.nodes, ctx.constants)
        try:  # a corrupt file's shapes or options that no op takes: named with the file (node names say the operator)
            check_shapes(graph)
            check_given(graph.nodes)
        except BuildError as error:
            raise UsageError(f"{self.path}: {error}") from None
        return graph
