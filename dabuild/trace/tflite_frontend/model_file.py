"""Reading a .tflite flatbuffer: checked before it is decoded, decoded with TFLite's own generated schema.

The schema is the generated Python of `tensorflow/lite/schema/schema.fbs` that
the `tflite-micro` package ships (an object API over the `flatbuffers`
runtime, no TensorFlow). It is chosen over the `tflite` package because the
tflite target writes files with the same classes (`ModelT.Pack`), and TFLM's
own interpreter, which checks those files, comes in the same package; the
`tflite` package's bindings only read, and trail the schema.

A file is untrusted: its size is checked before it is read, the identifier
"TFL3" and schema version 3 are required, and any error the decoder raises on
a truncated or corrupt buffer becomes one UsageError naming the file.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np

from dabuild.errors import UsageError
from dabuild.limits import max_nodes

MAX_FILE_BYTES = 2**31  # flatbuffers address at most 2 GiB
IDENTIFIER = b"TFL3"
SCHEMA_VERSION = 3
DECODE_ERRORS = (IndexError, ValueError, TypeError, AttributeError, struct.error, OverflowError, RecursionError,
                 UnicodeDecodeError)

# TensorType -> numpy type, for the types a model's tensors may hold here
NUMPY_TYPES = {"FLOAT32": np.float32, "INT8": np.int8, "UINT8": np.uint8, "INT16": np.int16, "INT32": np.int32,
               "INT64": np.int64, "BOOL": np.bool_, "FLOAT16": np.float16}


def schema() -> Any:
    """TFLite's generated schema module (from the tflite-micro package): UsageError naming the extra if absent."""
    try:
        from tflite_micro.tensorflow.lite.micro.python import schema_py_generated
    except ImportError as error:
        raise UsageError(f"the tflite frontend needs the tflite-micro package ({error}): "
                         "pip install 'dabuild[tflite]'") from None
    return schema_py_generated


def enum_names(enum: type) -> dict[int, str]:
    """An enum class of the generated schema as value -> name."""
    return {value: name for name, value in vars(enum).items() if not name.startswith("_")}


def read_model(path: Path) -> Any:
    """The ModelT of a .tflite file; UsageError naming the file for anything that is no TFLite model."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as error:
        raise UsageError(f"{path}: cannot read the model file ({error.strerror})") from None
    if size > MAX_FILE_BYTES:
        raise UsageError(f"{path}: {size} bytes is larger than a flatbuffer can be ({MAX_FILE_BYTES})")
    data = path.read_bytes()
    if len(data) < 8 or data[4:8] != IDENTIFIER:
        raise UsageError(f"{path}: not a TFLite flatbuffer (no {IDENTIFIER.decode()} identifier at byte 4)")
    generated = schema()
    try:
        root = generated.Model.GetRootAs(data, 0)
        operators = sum(root.Subgraphs(i).OperatorsLength() for i in range(root.SubgraphsLength()))
    except DECODE_ERRORS as error:
        raise UsageError(f"{path}: the flatbuffer is truncated or corrupt ({type(error).__name__}: {error})") from None
    limit = max_nodes()
    if operators > limit:  # counted on the raw buffer: unpacking a hostile file would cost the work it guards
        raise UsageError(f"{path}: the model holds {operators:,} operators, over the limit of {limit:,} "
                         "(DABUILD_MAX_NODES); refused before tracing")
    try:
        model = generated.ModelT.InitFromPackedBuf(data, 0)
    except DECODE_ERRORS as error:  # what the generated decoder raises where a corrupt offset leads it
        raise UsageError(f"{path}: the flatbuffer is truncated or corrupt ({type(error).__name__}: {error})") from None
    if model.version != SCHEMA_VERSION:
        raise UsageError(f"{path}: TFLite schema version {model.version}; dabuild reads version {SCHEMA_VERSION}")
    if not model.subgraphs:
        raise UsageError(f"{path}: the model has no subgraph")
    return model


def buffer_array(model: Any, tensor: Any, where: str) -> np.ndarray | None:
    """The constant data of `tensor` as a numpy array of its shape, or None for a run-time tensor."""
    buffers = listed(model.buffers)
    if tensor.buffer <= 0 or tensor.buffer >= len(buffers):
        return None
    buffer = buffers[tensor.buffer]
    if buffer.data is None or len(buffer.data) == 0:
        if buffer.offset:
            raise UsageError(f"{where}: tensor {tensor_name(tensor)!r} keeps its data outside the flatbuffer "
                             "(a model over 2 GiB); dabuild reads models whose buffers are inside")
        return None
    type_name = enum_names(schema().TensorType)[tensor.type]
    dtype = NUMPY_TYPES.get(type_name)
    if dtype is None:
        raise UsageError(f"{where}: tensor {tensor_name(tensor)!r} is of type {type_name}, which dabuild cannot read")
    shape = tuple(int(d) for d in (tensor.shape if tensor.shape is not None else ()))
    raw = np.asarray(buffer.data, dtype=np.uint8).tobytes()
    if len(raw) != int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize:
        raise UsageError(f"{where}: tensor {tensor_name(tensor)!r} holds {len(raw)} bytes, not the "
                         f"{int(np.prod(shape))} {type_name} values of its shape {list(shape)}")
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def listed(vector: Any) -> list[Any]:
    """A vector field of the object API (a list, a numpy array of indices, or None when absent) as a list."""
    return [] if vector is None else [int(v) if isinstance(v, np.integer) else v for v in vector]


def tensor_name(tensor: Any) -> str:
    name = tensor.name
    return name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)
