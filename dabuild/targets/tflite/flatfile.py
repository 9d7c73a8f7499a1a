"""A .tflite flatbuffer under construction: tensors, buffers, operators, and where each QGraph tensor lies.

Written with the object API of TFLite's generated schema (the tflite-micro package's `schema_py_generated`,
the one the tflite frontend reads with): `ModelT.Pack` does the flatbuffer layout, so this module only fills
plain objects.

Layouts: dabuild's tensors of rank 4 (batch first) are NCHW; TFLite's spatial operators take NHWC. A QGraph
tensor may therefore lie in the file in its own axis order ("plain") or channels last ("nhwc"), and a writer
asks for the layout its operator needs (`value`). The first request of a layout the tensor does not lie in
yet adds one TRANSPOSE, kept for every later reader; a transpose layer that only moves between the two
layouts costs nothing (the writer binds its output to the same file tensor, `place`). The model's input and
output are plain: the file takes and returns the QGraph's own shapes.

A rank-3 (N, C, L) tensor lies channels last as [N, 1, L, C] (`file_shape`), the unit height TensorFlow's
converter gives a Conv1D; to and from plain it takes a TRANSPOSE of the rows [N, L, C] and a RESHAPE. That
layout has no axis `permutation`, so only elementwise writers keep it; the others read such a tensor plain.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dabuild.errors import BuildError
from dabuild.qir.qgraph import QGraph, QuantParams

PLAIN, NHWC = "plain", "nhwc"
TO_NHWC = (0, 2, 3, 1)   # file axis j of an nhwc tensor holds NCHW axis TO_NHWC[j]
VERSION = 3
IDENTIFIER = b"TFL3"
TYPES = {"int8": "INT8", "int16": "INT16", "int32": "INT32", "int64": "INT64", "float32": "FLOAT32"}
STORAGE_TYPES = {"int8": "int8", "int16": "int16"}  # QGraph dtype -> the file's tensor type (what TFLM runs)


def schema() -> Any:
    """TFLite's generated schema (BuildError naming the extra where the package is absent)."""
    try:
        from tflite_micro.tensorflow.lite.micro.python import schema_py_generated
    except ImportError as error:
        raise BuildError(f"the tflite target needs the tflite-micro package ({error}): "
                         "pip install 'dabuild[tflite]'") from None
    return schema_py_generated


def permutation(layout: str, rank: int) -> tuple[int, ...]:
    """How a tensor of `rank` axes (batch included) lies in the file: file axis j holds axis result[j]."""
    return TO_NHWC if layout == NHWC and rank == 4 else tuple(range(rank))


def file_shape(layout: str, shape: tuple[int, ...]) -> list[int]:
    """The file tensor's shape of a tensor of `shape` (batch first) in `layout`."""
    if layout == NHWC and len(shape) == 3:
        return [shape[0], 1, shape[2], shape[1]]
    return [shape[a] for a in permutation(layout, len(shape))]


def spatial_layouts(rank: int) -> tuple[str, ...]:
    """The layouts a tensor of `rank` axes may lie in (more than one: they differ)."""
    return (PLAIN, NHWC) if rank in (3, 4) else (PLAIN,)


def file_axis(layout: str, rank: int, axis: int) -> int:
    """Where axis `axis` (batch-first numbering) of a tensor lies in the file."""
    return permutation(layout, rank).index(axis % rank)


@dataclass
class Placed:
    """A file tensor holding a QGraph tensor in one layout."""

    index: int
    layout: str


@dataclass
class FlatFile:
    """The file being written for one QGraph: `value` finds (or makes) a QGraph tensor's file tensor in a
    layout, `tensor` adds a new one, `operator` appends an operator, `finish` packs the model."""

    qgraph: QGraph
    model: Any = None
    placed: dict[str, list[Placed]] = field(default_factory=dict)
    producers: dict[int, Any] = field(default_factory=dict)   # file tensor -> the operator writing it
    readers: dict[str, int] = field(default_factory=dict)     # QGraph tensor -> layers reading it (+1: output)
    bounds: dict[int, tuple[int, int]] = field(default_factory=dict)  # file tensor -> the clamp its writer applies
    clamped: set[str] = field(default_factory=set)   # QGraph tensors whose file tensor a fused clamp changed
    float_io: bool = False   # the model takes and returns float32 (QUANTIZE and DEQUANTIZE at the edges)
    floats: dict[str, int] = field(default_factory=dict)   # QGraph tensor -> its float32 file tensor at an edge

    def __post_init__(self) -> None:
        generated = schema()
        self.s = generated
        self.model = generated.ModelT()
        self.model.version = VERSION
        self.model.description = "dabuild"
        self.model.buffers = [generated.BufferT()]   # buffer 0: the empty buffer every run-time tensor points at
        self.model.operatorCodes = []
        self.subgraph = generated.SubGraphT()
        self.subgraph.tensors, self.subgraph.operators = [], []
        self.model.subgraphs = [self.subgraph]
        for layer in self.qgraph.layers:
            for name in layer.inputs:
                self.readers[name] = self.readers.get(name, 0) + 1
        self.readers[self.qgraph.output] = self.readers.get(self.qgraph.output, 0) + 1

    # ------------------------------------------------------------------ tensors

    def rank(self, name: str) -> int:
        return len(self.qgraph.tensors[name].shape) + 1

    def params(self, name: str) -> QuantParams:
        return self.qgraph.tensors[name].params

    def tensor(self, name: str, shape: tuple[int, ...] | list[int], dtype: str, params: QuantParams | None = None,
               data: np.ndarray | None = None, scales: np.ndarray | None = None, axis: int = 0) -> int:
        """A new file tensor (constant with `data`); quantized by `params`, or per channel by `scales` along
        `axis` with zero points 0. Its index."""
        tensor = self.s.TensorT()
        tensor.name = name
        tensor.shape = [int(d) for d in shape]
        tensor.type = getattr(self.s.TensorType, TYPES[dtype])
        tensor.buffer = 0
        if data is not None:
            buffer = self.s.BufferT()
            buffer.data = np.frombuffer(np.ascontiguousarray(data, dtype=dtype).tobytes(), np.uint8)
            self.model.buffers.append(buffer)
            tensor.buffer = len(self.model.buffers) - 1
        if params is not None or scales is not None:
            quantization = self.s.QuantizationParametersT()
            if scales is not None:
                quantization.scale = [float(np.float32(s)) for s in np.ravel(scales)]
                quantization.zeroPoint = [0] * len(quantization.scale)
                quantization.quantizedDimension = axis
            else:
                assert params is not None
                quantization.scale = [float(np.float32(params.scale))]
                quantization.zeroPoint = [int(params.zero_point)]
            tensor.quantization = quantization
        self.subgraph.tensors.append(tensor)
        return len(self.subgraph.tensors) - 1

    def activation(self, name: str, layout: str, params: QuantParams | None = None, suffix: str = "") -> int:
        """A new run-time file tensor for QGraph tensor `name` in `layout` (params: its own unless given)."""
        params = params or self.params(name)
        shape = (1, *self.qgraph.tensors[name].shape)
        return self.tensor(name + suffix, file_shape(layout, shape), self.dtype(params), params)

    def float_tensor(self, name: str) -> int:
        """The float32 file tensor of QGraph tensor `name` (plain), the model's edge in `float_io`."""
        if name not in self.floats:
            self.floats[name] = self.tensor(f"{name}/float", (1, *self.qgraph.tensors[name].shape), "float32")
        return self.floats[name]

    def dtype(self, params: QuantParams) -> str:
        if params.dtype not in STORAGE_TYPES:
            raise BuildError(f"the tflite target writes int8 and int16 tensors, not {params.dtype}")
        return STORAGE_TYPES[params.dtype]

    def place(self, name: str, index: int, layout: str) -> None:
        """Bind QGraph tensor `name` to file tensor `index` in `layout`."""
        self.placed.setdefault(name, []).append(Placed(index, layout))

    def layouts(self, name: str) -> list[Placed]:
        """Where `name` lies in the file so far (a constant: nowhere until asked for)."""
        return self.placed.get(name, [])

    def value(self, name: str, layout: str) -> int:
        """The file tensor of QGraph tensor `name` in `layout`: an existing one, a constant written for it, or
        a TRANSPOSE of the first one written (ranks 3 and 4; the others lie the same in both layouts)."""
        rank = self.rank(name)
        if layout not in spatial_layouts(rank):
            layout = PLAIN
        for placed in self.layouts(name):
            if placed.layout == layout or len(spatial_layouts(rank)) == 1:
                return placed.index
        if name in self.qgraph.constants:
            return self.constant(name, self.qgraph.constants[name], layout, self.rank(name))
        if not self.layouts(name):
            raise BuildError(f"tflite export: tensor {name!r} is read before any layer writes it")
        source = self.layouts(name)[0]
        index = self.activation(name, layout, suffix=f"/{layout}")
        if rank == 4:
            back = np.argsort(permutation(source.layout, 4))   # file axes of the source back to NCHW
            perm = back[list(permutation(layout, 4))]
            self.operator("TRANSPOSE", [source.index, self.ints(f"{name}/perm", perm)], [index])
        else:
            self.regroup_rows(name, source.index, index, layout)
        self.place(name, index, layout)
        return index

    def regroup_rows(self, name: str, source: int, target: int, layout: str) -> None:
        """Rank 3 between [1, C, L] (plain) and [1, 1, L, C] (nhwc): a TRANSPOSE of the rank-3 rows [1, L, C]
        and a RESHAPE dropping or adding the unit height (TRANSPOSE keeps the rank)."""
        channels, length = self.qgraph.tensors[name].shape
        rows_shape = [1, length, channels]
        rows = self.tensor(f"{name}/rows", rows_shape, self.dtype(self.params(name)), self.params(name))
        swap = self.ints(f"{name}/rows_perm", [0, 2, 1])
        if layout == NHWC:
            self.operator("TRANSPOSE", [source, swap], [rows])
            shape = [1, 1, length, channels]
            self.operator("RESHAPE", [rows, self.ints(f"{name}/rows_shape", shape)], [target], "ReshapeOptions",
                          newShape=shape)
        else:
            self.operator("RESHAPE", [source, self.ints(f"{name}/rows_shape", rows_shape)], [rows], "ReshapeOptions",
                          newShape=rows_shape)
            self.operator("TRANSPOSE", [rows, swap], [target])

    def constant(self, name: str, values: np.ndarray, layout: str, rank: int) -> int:
        """A QGraph integer constant as a file constant, broadcast to `rank` axes (batch first) in `layout`."""
        values = np.asarray(values)
        values = values.reshape((1,) * (rank - values.ndim) + values.shape) if values.ndim < rank else values
        shape = file_shape(layout, values.shape)
        data = values.transpose(permutation(layout, rank) if rank != 3 or layout == PLAIN else (0, 2, 1))
        index = self.tensor(name, shape, self.dtype(self.params(name)), self.params(name), data.reshape(shape))
        self.place(name, index, layout)
        return index

    def ints(self, name: str, values: Any, dtype: str = "int32") -> int:
        """A constant integer operand (a shape, axes, paddings)."""
        array = np.asarray(values, dtype=dtype)
        return self.tensor(name, list(array.shape), dtype, data=array)

    # ------------------------------------------------------------------ operators

    def operator(self, builtin: str, inputs: list[int], outputs: list[int], options: str | None = None,
                 **fields: Any) -> Any:
        """Append an operator of `builtin` with its `options` table (e.g. "Conv2DOptions") set from `fields`."""
        code = getattr(self.s.BuiltinOperator, builtin)
        codes = self.model.operatorCodes
        found = next((i for i, c in enumerate(codes) if c.builtinCode == code), None)
        if found is None:
            entry = self.s.OperatorCodeT()
            entry.builtinCode = code
            entry.deprecatedBuiltinCode = min(code, self.s.BuiltinOperator.PLACEHOLDER_FOR_GREATER_OP_CODES)
            entry.version = 1
            codes.append(entry)
            found = len(codes) - 1
        op = self.s.OperatorT()
        op.opcodeIndex = found
        op.inputs, op.outputs = list(inputs), list(outputs)
        if options is not None:
            table = getattr(self.s, f"{options}T")()
            for key, value in fields.items():
                if not hasattr(table, key):
                    raise AssertionError(f"{options} has no field {key!r}")
                setattr(table, key, value)
            op.builtinOptionsType = getattr(self.s.BuiltinOptions, options)
            op.builtinOptions = table
        self.subgraph.operators.append(op)
        for index in outputs:
            self.producers[index] = op
        return op

    def finish(self) -> bytes:
        """The packed model: input and output plain, as the QGraph shapes them (float32 in `float_io`)."""
        import flatbuffers

        output = self.value(self.qgraph.output, PLAIN)
        if self.float_io:
            self.operator("DEQUANTIZE", [output], [self.float_tensor(self.qgraph.output)])
        self.subgraph.inputs = [self.float_tensor(self.qgraph.input) if self.float_io
                                else self.value(self.qgraph.input, PLAIN)]
        self.subgraph.outputs = [self.float_tensor(self.qgraph.output) if self.float_io else output]
        builder = flatbuffers.Builder(1024)
        builder.Finish(self.model.Pack(builder), file_identifier=IDENTIFIER)
        return bytes(builder.Output())
