"""The state of one .tflite conversion: names, layouts, constants and the quantization the file states.

dabuild's graph is channels first, TFLite's channels last: a rank-4 run-time
tensor is kept NCHW in the graph (one transpose after the input), and `nhwc`
gives it back in the file's order to an op that depends on the order (reshape,
fully connected, softmax, strided slice); a 4-D axis of the file maps through
`NHWC_TO_NCHW`.

Quantization (dabuild/ir/given_quant.py's contract): every quantized tensor the file
holds is, in the graph, a float tensor of its real values. A quantized run-time
tensor is written by a `fake_quant` with the file's scale and zero point after
the op that computes it; a quantized weight is its real values behind a
`fake_quant` (folded into `Graph.given`), its per-channel axis moved with the
weight's transpose; an int32 or int64 bias is its real value, q * s_x * s_w.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dabuild.ir.given_quant import GivenQuant
from dabuild.ir.graph import Node
from dabuild.trace.tflite_frontend.model_file import buffer_array, enum_names, listed, schema, tensor_name

NHWC_TO_NCHW = (0, 2, 3, 1)   # axis a of an NHWC tensor is axis NHWC_TO_NCHW[a] of its NCHW form
TO_NCHW, TO_NHWC = [0, 3, 1, 2], [0, 2, 3, 1]
ACTIVATION_BITS = {"INT8": (8, True), "UINT8": (8, False), "INT16": (16, True)}


class Unsupported(Exception):
    """What one operator asks that dabuild cannot represent; the tracer names the file and the operator."""


class Conversion:
    def __init__(self, model: Any, where: str):
        self.model, self.where = model, where
        self.graph = model.subgraphs[0]
        self.tensors = listed(self.graph.tensors)
        self.names: dict[int, str] = {}
        self.inputs: dict[int, str] = {}   # a model input's name before its transpose to NCHW
        self.nchw: set[str] = set()
        self.nodes: list[Node] = []
        self.constants: dict[str, np.ndarray] = {}
        self._used: set[str] = set()
        self.type_names = enum_names(schema().TensorType)
        self.label = ""  # the operator being converted, for node names

    # ------------------------------------------------------------ names and nodes

    def fresh(self, base: str) -> str:
        name, index = base, 0
        while name in self._used:
            index += 1
            name = f"{base}_{index}"
        self._used.add(name)
        return name

    def emit(self, op: str, inputs: list[str], attrs: dict[str, Any] | None = None, nchw: bool = False) -> str:
        """Append one node of `op` writing a fresh tensor; its name (kept NCHW when `nchw`)."""
        output = self.fresh(f"{self.label}/{op}")
        self.nodes.append(Node(self.fresh(f"{self.label}:{op}"), op, inputs, [output], attrs or {}))
        if nchw:
            self.nchw.add(output)
        return output

    def constant(self, base: str, values: np.ndarray) -> str:
        name = self.fresh(base)
        self.constants[name] = np.ascontiguousarray(values, dtype=np.float32)
        return name

    # ------------------------------------------------------------ tensors of the file

    def tensor(self, index: int) -> Any:
        if not 0 <= index < len(self.tensors):
            raise Unsupported(f"tensor index {index} is out of range (the subgraph has {len(self.tensors)})")
        return self.tensors[index]

    def shape(self, index: int) -> tuple[int, ...]:
        shape = self.tensor(index).shape
        return tuple(int(d) for d in (shape if shape is not None else ()))

    def type_name(self, index: int) -> str:
        return self.type_names.get(self.tensor(index).type, f"type {self.tensor(index).type}")

    def data(self, index: int) -> np.ndarray | None:
        return buffer_array(self.model, self.tensor(index), self.where)

    def static(self, index: int, what: str) -> np.ndarray:
        values = self.data(index)
        if values is None:
            raise Unsupported(f"its {what} (tensor {tensor_name(self.tensor(index))!r}) must be a constant")
        return values

    def quantization(self, index: int) -> tuple[np.ndarray, np.ndarray, int] | None:
        """(scales, zero points, quantized dimension) the file states for a tensor, or None (float)."""
        params = self.tensor(index).quantization
        if params is None or params.scale is None or len(params.scale) == 0:
            return None
        scale = np.asarray(params.scale, dtype=np.float64)
        zero_point = np.zeros(len(scale), np.int64) if params.zeroPoint is None or len(params.zeroPoint) == 0 \
            else np.asarray(params.zeroPoint, dtype=np.int64)
        if len(zero_point) == 1 and len(scale) > 1:
            zero_point = np.repeat(zero_point, len(scale))
        if len(zero_point) != len(scale) or not np.all(np.isfinite(scale) & (scale > 0)):
            raise Unsupported(f"tensor {tensor_name(self.tensor(index))!r} states {len(scale)} scales (smallest "
                              f"{scale.min():g}) and {len(zero_point)} zero points: not a quantization")
        return scale, zero_point, int(params.quantizedDimension)

    def real(self, index: int) -> np.ndarray:
        """A constant's real values: integers dequantized by the file's own scales and zero points."""
        values = self.static(index, "constant")
        quant = self.quantization(index)
        if quant is None or values.dtype.kind == "f":
            return values.astype(np.float32)
        scale, zero_point, axis = quant
        shape = [1] * values.ndim
        if len(scale) > 1:
            if not 0 <= axis < values.ndim or values.shape[axis] != len(scale):
                raise Unsupported(f"tensor {tensor_name(self.tensor(index))!r} of shape {list(values.shape)} states "
                                  f"{len(scale)} scales along axis {axis}: not a per-axis quantization of it")
            shape[axis] = -1
        return ((values.astype(np.float64) - zero_point.reshape(shape)) * scale.reshape(shape)).astype(np.float32)

    def value(self, index: int) -> str:
        """A run-time tensor's graph name (NCHW if 4-D), or a constant's real values in the file's layout."""
        if index in self.names:
            return self.names[index]
        if self.data(index) is None:
            raise Unsupported(f"tensor {tensor_name(self.tensor(index))!r} is read before any operator writes it")
        return self.constant(tensor_name(self.tensor(index)) or "constant", self.real(index))

    def nhwc(self, index: int) -> str:
        """A tensor in the file's own layout (a 4-D run-time tensor transposed back from NCHW)."""
        name = self.value(index)
        return self.emit("transpose", [name], {"perm": TO_NHWC}) if name in self.nchw else name

    def like(self, index: int, nchw: bool) -> str:
        """A tensor in the layout of an operand that is (`nchw`) or is not NCHW: a 4-D constant transposed,
        a lower-rank constant broadcast over the channels (last axis in the file) put in NCHW's form."""
        name = self.value(index)
        if not nchw or name in self.nchw:
            return name if nchw or name not in self.nchw else self.nhwc(index)
        if name not in self.constants:
            raise Unsupported("it mixes a 4-D tensor with a run-time tensor of another rank")
        values = self.constants[name]
        values = values.reshape((1,) * (4 - values.ndim) + values.shape)
        return self.constant(name, values.transpose(TO_NCHW))

    def weight(self, index: int, perm: list[int], channel_axis: int) -> str:
        """A weight in dabuild's layout (the file's axes permuted by `perm`), behind a fake_quant stating its
        quantization; the file's per-channel axis must be `channel_axis` (of the file's layout)."""
        quant = self.quantization(index)
        if quant is not None and len(quant[0]) > 1 and quant[2] != channel_axis:
            raise Unsupported(f"weight {tensor_name(self.tensor(index))!r} is quantized per axis {quant[2]}; dabuild "
                              f"quantizes this weight per axis {channel_axis} (its output channels) or per tensor")
        real = self.real(index).transpose(perm)
        name = self.constant(tensor_name(self.tensor(index)) or "weight", real)
        if quant is None:
            return name
        scale, zero_point, axis = quant
        bits, signed = self._bits(index)
        given = GivenQuant(tuple(float(s) for s in scale), tuple(int(z) for z in zero_point), bits, signed,
                           perm.index(axis) if len(scale) > 1 else None, rounding="half_away")
        return self.emit("fake_quant", [name], given.attrs())

    def bias(self, index: int, source: int, weight: int) -> list[str]:
        """An optional bias (index -1: none) as its real values. An integer bias of a quantized `source` and
        `weight` counts in units of s_source * s_weight, as TFLite's kernels add it to their sums, whatever
        scale the file states for it (the converter's 16x8 files state other ones), so the given quantization
        rebuilds the file's very integers."""
        if index < 0:
            return []
        values, sources, weights = self.static(index, "bias"), self.quantization(source), self.quantization(weight)
        real = self.real(index)
        if values.dtype.kind == "i" and sources is not None and weights is not None:
            real = (values.astype(np.float64) * sources[0][0] * weights[0]).astype(np.float32)
        return [self.constant(tensor_name(self.tensor(index)) or "bias", real)]

    def _bits(self, index: int) -> tuple[int, bool]:
        type_name = self.type_name(index)
        if type_name not in ACTIVATION_BITS:
            raise Unsupported(f"tensor {tensor_name(self.tensor(index))!r} is a quantized {type_name}; dabuild "
                              "takes int8, uint8 and int16 quantized tensors (int32 and int64 as biases)")
        return ACTIVATION_BITS[type_name]

    def write(self, index: int, result: str) -> None:
        """Bind the file's tensor `index` to `result` (a float tensor), behind a fake_quant when quantized."""
        self.names[index] = self.quantized(index, result)

    def quantized(self, index: int, result: str) -> str:
        """`result` behind a fake_quant with the quantization of the file's tensor `index` (none: as it is)."""
        quant = self.quantization(index)
        if quant is not None:
            scale, zero_point, _ = quant
            if len(scale) > 1:
                raise Unsupported(f"tensor {tensor_name(self.tensor(index))!r} is a run-time tensor quantized per "
                                  "axis; dabuild quantizes activations per tensor")
            bits, signed = self._bits(index)
            given = GivenQuant((float(scale[0]),), (int(zero_point[0]),), bits, signed, rounding="half_away")
            result = self.emit("fake_quant", [result], given.attrs(), nchw=result in self.nchw)
        return result
