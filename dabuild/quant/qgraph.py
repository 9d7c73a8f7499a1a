"""QGraph: the integer-lowered graph that integer targets execute bit-exactly.

Everything a kernel needs is an integer here (int8 weights, int32 biases,
Q31 multipliers with right shifts); the float scales stay only to quantize
inputs and dequantize outputs at the edges, and for reports.

Per-channel readiness: requantization multipliers, shifts and weight scales
are arrays of length 1 (per tensor) or out_features (per channel); kernels
index them with `channel if len > 1 else 0`.

Rounding, used everywhere a real number becomes an integer (input
quantization, weights, biases, requantization): round half away from zero.
It is symmetric, and in C it needs only shifts of non-negative numbers, whose
result the standard defines (right shifts of negative values are
implementation-defined in C99).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from dabuild.ir.npz import read_npz, write_npz

QGRAPH_FILE = "qgraph.json"
QWEIGHTS_FILE = "qweights.npz"
FORMAT_VERSION = 1
INT_RANGES: dict[str, tuple[int, int]] = {"int8": (-128, 127)}


def round_half_away(x: np.ndarray) -> np.ndarray:
    """Round to nearest, ties away from zero (numpy's own rounding sends ties to even)."""
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


@dataclass(frozen=True)
class QuantParams:
    """Affine mapping real = scale * (q - zero_point) of one tensor."""

    scale: float
    zero_point: int
    dtype: str = "int8"

    @property
    def qmin(self) -> int:
        return INT_RANGES[self.dtype][0]

    @property
    def qmax(self) -> int:
        return INT_RANGES[self.dtype][1]

    def quantize(self, x: np.ndarray) -> np.ndarray:
        """float -> int in float32, the way model_forward_float does it in C."""
        scaled = np.asarray(x, dtype=np.float32) / np.float32(self.scale)
        # Bound before rounding (C must, float->int of huge values is undefined); NaN goes to the bottom.
        span = np.float32(self.qmax - self.qmin)
        scaled = np.minimum(np.where(scaled >= -span - 1, scaled, -span - 1), span)
        q = round_half_away(scaled) + np.float32(self.zero_point)
        return np.clip(q, self.qmin, self.qmax).astype(self.dtype)

    def dequantize(self, q: np.ndarray) -> np.ndarray:
        """int -> float32, the way model_forward_float does it in C."""
        centred = (np.asarray(q).astype(np.int32) - np.int32(self.zero_point)).astype(np.float32)
        return centred * np.float32(self.scale)


@dataclass
class QTensor:
    """An activation tensor: its per-sample shape (no batch axis) and quantization."""

    shape: tuple[int, ...]
    params: QuantParams

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


@dataclass
class QLayer:
    """Base of integer layers; array fields go to the npz file, the rest to JSON attrs."""

    op: ClassVar[str]
    name: str
    inputs: list[str]
    outputs: list[str]

    def _payload(self) -> list[dataclasses.Field]:
        return [f for f in dataclasses.fields(self) if f.name not in ("name", "inputs", "outputs")]

    def attrs(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in self._payload()
                if not isinstance(getattr(self, f.name), np.ndarray)}

    def arrays(self) -> dict[str, np.ndarray]:
        return {f.name: getattr(self, f.name) for f in self._payload()
                if isinstance(getattr(self, f.name), np.ndarray)}


@dataclass
class QDense(QLayer):
    """y = requantize(x_centred @ weight + bias) + out_zp, clamped (at out_zp when relu is fused)."""

    op: ClassVar[str] = "dense"
    weight: np.ndarray        # int8 (in_features, out_features), symmetric
    bias: np.ndarray          # int32 (out_features,), in units of s_in * s_w
    multiplier: np.ndarray    # int32 (1 or out_features,), Q31 mantissa of s_in * s_w / s_out
    shift: np.ndarray         # int32 (1 or out_features,), total right shift (31 - exponent)
    weight_scale: np.ndarray  # float64 (1 or out_features,), kept for reports and dequantization
    relu: bool

    @property
    def in_features(self) -> int:
        return int(self.weight.shape[0])

    @property
    def out_features(self) -> int:
        return int(self.weight.shape[1])


@dataclass
class QRelu(QLayer):
    """max(x, zero_point): a relu is exact in its input's quantized domain, so it keeps its params."""

    op: ClassVar[str] = "relu"


LAYER_TYPES: dict[str, type[QLayer]] = {cls.op: cls for cls in (QDense, QRelu)}


@dataclass
class QGraph:
    input: str
    output: str
    tensors: dict[str, QTensor]
    layers: list[QLayer]

    @property
    def input_names(self) -> list[str]:
        """Graph input names, as the float Graph lists them (integer lowering allows one)."""
        return [self.input]

    @property
    def input_params(self) -> QuantParams:
        return self.tensors[self.input].params

    @property
    def output_params(self) -> QuantParams:
        return self.tensors[self.output].params

    def save(self, directory: Path) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        doc = {
            "format": FORMAT_VERSION,
            "input": self.input,
            "output": self.output,
            "tensors": {name: {"shape": list(t.shape), **dataclasses.asdict(t.params)}
                        for name, t in self.tensors.items()},
            "layers": [{"name": layer.name, "op": layer.op, "inputs": layer.inputs,
                        "outputs": layer.outputs, "attrs": layer.attrs()} for layer in self.layers],
        }
        (directory / QGRAPH_FILE).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        write_npz(directory / QWEIGHTS_FILE, {f"{layer.name}/{key}": value for layer in self.layers
                                             for key, value in layer.arrays().items()})

    @classmethod
    def load(cls, directory: Path) -> "QGraph":
        directory = Path(directory)
        doc = json.loads((directory / QGRAPH_FILE).read_text())
        if doc.get("format") != FORMAT_VERSION:
            raise ValueError(f"{directory / QGRAPH_FILE}: unsupported format {doc.get('format')!r}")
        arrays = read_npz(directory / QWEIGHTS_FILE)
        tensors = {name: QTensor(tuple(t["shape"]), QuantParams(t["scale"], t["zero_point"], t["dtype"]))
                   for name, t in doc["tensors"].items()}
        layers = []
        per_layer: dict[str, dict[str, np.ndarray]] = {}
        for key, value in arrays.items():
            layer_name, _, field_name = key.rpartition("/")
            per_layer.setdefault(layer_name, {})[field_name] = value
        for entry in doc["layers"]:
            layer_type = LAYER_TYPES[entry["op"]]
            own = per_layer.get(entry["name"], {})
            layers.append(layer_type(name=entry["name"], inputs=entry["inputs"], outputs=entry["outputs"],
                                     **entry["attrs"], **own))
        return cls(doc["input"], doc["output"], tensors, layers)
