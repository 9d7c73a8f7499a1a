"""QGraph: the integer-lowered graph that integer targets execute bit-exactly.

A QGraph is a DAG: named integer tensors (int8 by default; any type of
`dabuild.qir.dtypes`), each with its per-tensor QuantParams,
and layers in schedule order, each reading one or more tensors and writing one
or more. Tensor names are the float graph's, so a per-layer trace of the
integer reference lines up with the float interpreter's; the few tensors
lowering adds (the input of an activation table split off a conv) carry a
`:` suffix. Graph-level `constants` hold integer constants a layer reads (an
addend, a concat piece) and the float constants of fp32 fallback layers.

Float islands: `floats` holds the per-sample shapes of the tensors that stay
in float32 (the inside of a float island, see `dabuild.quant.quantize`); no
QuantParams exist for them, layers read and write them as float32 arrays.

Everything a kernel needs is an integer here (integer weights, int32 biases, Q31
multipliers with right shifts, lookup tables); the float scales stay to
quantize inputs and dequantize outputs at the edges, and for reports. The
arithmetic rules (rounding half away from zero, Q31 requantization, or TFLite
Micro's rounding where `rounding` asks for it) are in `fixed_point`; each layer class holds its fields and its numpy reference
kernel `run`, which computes the bits the C kernels must reproduce.

Per-channel weights: requantization multipliers, shifts and weight scales are
arrays of length 1 (per tensor) or one per output channel.
"""

from __future__ import annotations

import dataclasses
import json
from abc import ABC, abstractmethod
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from dabuild.errors import BuildError
from dabuild.ir.kernels.native import layer_thread_count, native_conv
from dabuild.ir.npz import read_npz, write_npz
from dabuild.qir.dtypes import int_type
from dabuild.qir.fixed_point import round_half_away
from dabuild.qir.layers import MODULES as LAYER_MODULES
from dabuild.registry import Registry

QGRAPH_FILE = "qgraph.json"
QWEIGHTS_FILE = "qweights.npz"
FORMAT_VERSION = 2
NATIVE_SIZE = 4096  # QuantParams.quantize takes arrays of this many values and more to quantize.c
_CONSTANT_KEY = ":constant:"  # npz member prefix of graph constants (layer arrays are "<layer>/<field>")

Trace = dict[str, np.ndarray]


DEQUANTIZE_TABLE_SIZE = 4096  # values from which `QuantParams.dequantize` looks one-byte values up in a table


@dataclass(frozen=True)
class QuantParams:
    """Affine mapping real = scale * (q - zero_point) of one tensor.

    `rounding` and `overflow` say how `quantize` makes floats integers: dabuild's own half away from zero and
    saturation, or (the input of a fixed-point given model, whose first quantizer reads raw values) `floor`
    and `wrap`, so the logic's own quantizer sees what it would have seen of the float (`dabuild.ir.given_quant`)."""

    scale: float
    zero_point: int
    dtype: str = "int8"
    rounding: str = "half_away"
    overflow: str = "saturate"

    @property
    def plain(self) -> bool:
        """Quantized by dabuild's own rule (half away from zero, saturating), as every integer target does."""
        return self.rounding == "half_away" and self.overflow == "saturate"

    def to_json(self) -> dict[str, Any]:
        """The fields as JSON (rounding and overflow only where they are not dabuild's own)."""
        data = dataclasses.asdict(self)
        if self.plain:
            del data["rounding"], data["overflow"]
        return data

    @property
    def qmin(self) -> int:
        return int_type(self.dtype).qmin

    @property
    def qmax(self) -> int:
        return int_type(self.dtype).qmax

    @property
    def storage(self) -> str:
        """The numpy dtype the tensor's integers are stored in (int8 for int2..int8, ...)."""
        return int_type(self.dtype).storage

    def quantize(self, x: np.ndarray) -> np.ndarray:
        """float -> int in float32, the way model_forward_float does it in C (and quantize.c, which takes
        large arrays: a graph input, a float island's output)."""
        if not self.plain:
            return self._quantize_fixed(x)
        native = native_conv()
        storage = np.dtype(self.storage)
        if native is not None and native.integer is not None and storage.itemsize <= 2 and np.size(x) >= NATIVE_SIZE:
            return native.integer.quantize(np.asarray(x, dtype=np.float32), self.scale, self.zero_point, self.qmin,
                                           self.qmax, storage, layer_thread_count())
        scaled = np.asarray(x, dtype=np.float32) / np.float32(self.scale)
        # Bound before rounding (C must, float->int of huge values is undefined); NaN goes to the bottom.
        span = np.float32(self.qmax - self.qmin)
        scaled = np.minimum(np.where(scaled >= -span - 1, scaled, -span - 1), span)
        q = round_half_away(scaled) + np.float32(self.zero_point)
        return np.clip(q, self.qmin, self.qmax).astype(self.storage)

    def _quantize_fixed(self, x: np.ndarray) -> np.ndarray:
        """float -> int by `rounding` and `overflow` (float64: exact for power-of-two scales)."""
        from dabuild.ir.given_quant import round_values

        scaled = np.nan_to_num(np.asarray(x, dtype=np.float64) / self.scale, nan=0.0, posinf=0.0, neginf=0.0)
        q = round_values(scaled, self.rounding) + self.zero_point
        if self.overflow == "wrap":
            q = np.mod(q - self.qmin, self.qmax - self.qmin + 1) + self.qmin
        return np.clip(q, self.qmin, self.qmax).astype(self.storage)

    def dequantize(self, q: np.ndarray) -> np.ndarray:
        """int -> float32, the way model_forward_float does it in C; in the memory order of `q` (as numpy's
        elementwise operations keep it), so what reduces the result sums it in the same order either way.

        Large arrays of a one-byte type look each value up in a table of the 256 results, computed alike:
        one pass over the data, where the arithmetic takes four (and three temporaries) for the same bits."""
        q = np.asarray(q)
        if q.dtype.itemsize == 1 and q.dtype.kind in "iu" and q.size >= DEQUANTIZE_TABLE_SIZE:
            order = np.argsort([-stride for stride in q.strides], kind="stable")  # axes, outermost in memory first
            codes = q.transpose(order)
            if codes.flags.c_contiguous:
                table = self._dequantized(np.arange(256, dtype=np.uint8).view(q.dtype))
                values = np.empty(codes.shape, np.float32)
                np.take(table, codes.view(np.uint8), out=values, mode="clip")  # every code is in the table
                return values.transpose(np.argsort(order))
        return self._dequantized(q)

    def _dequantized(self, q: np.ndarray) -> np.ndarray:
        centred = (q.astype(np.int32) - np.int32(self.zero_point)).astype(np.float32)
        return centred * np.float32(self.scale)

    def centred(self, q: np.ndarray) -> np.ndarray:
        """q - zero_point in int64: the integer a kernel multiplies or adds."""
        return np.asarray(q).astype(np.int64) - self.zero_point

    def saturate(self, values: np.ndarray) -> np.ndarray:
        """Integer values clamped to this dtype's range, in its storage type."""
        return np.clip(values, self.qmin, self.qmax).astype(self.storage)

    def all_values(self) -> np.ndarray:
        """Every integer of the dtype, ascending (the index set of a lookup table)."""
        return np.arange(self.qmin, self.qmax + 1, dtype=np.int64)


# The params of an integer graph input (token ids): its values are the integers themselves, never quantized.
INDICES = QuantParams(1.0, 0, "int32")


@dataclass
class QTensor:
    """An activation tensor: its per-sample shape (no batch axis) and quantization."""

    shape: tuple[int, ...]
    params: QuantParams

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


@dataclass
class QLayer(ABC):
    """Base of integer layers; array fields go to the npz file, the rest to JSON attrs.

    `run` is the layer's numpy reference: the integer (or int32/int64 for nothing
    but traces) arrays of its inputs, batch axis first, to those of its outputs.
    """

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

    def params(self, graph: QGraph, index: int = 0) -> QuantParams:
        """Quantization of input `index`."""
        return graph.tensors[self.inputs[index]].params

    def output_params(self, graph: QGraph, index: int = 0) -> QuantParams:
        return graph.tensors[self.outputs[index]].params

    @abstractmethod
    def run(self, inputs: list[np.ndarray], graph: QGraph, trace: Trace | None) -> list[np.ndarray]:
        """The output arrays; layers with an accumulator add it to `trace` as `<layer>:accumulator`."""


class DenseFeatures:
    """in_features and out_features of a layer whose `weight` is (in_features, out_features)."""

    weight: np.ndarray

    @property
    def in_features(self) -> int:
        return int(self.weight.shape[0])

    @property
    def out_features(self) -> int:
        return int(self.weight.shape[1])


LAYER_TYPES: Registry[type[QLayer]] = Registry("integer layer type", "the QGraph", LAYER_MODULES)


def layer_type(cls: type[QLayer]) -> type[QLayer]:
    """Class decorator registering a layer class under its `op`, so QGraph.load can rebuild it."""
    LAYER_TYPES.add(cls.op, cls)
    return cls


@dataclass
class QGraph:
    input: str
    output: str
    tensors: dict[str, QTensor]
    layers: list[QLayer]
    constants: dict[str, np.ndarray] = field(default_factory=dict)  # integer ones also have an entry in tensors
    floats: dict[str, tuple[int, ...]] = field(default_factory=dict)  # float island tensors: per-sample shapes
    rounding: str = "dabuild"  # how every requantization rounds (fixed_point.ROUNDINGS): a target's option

    @property
    def has_float_islands(self) -> bool:
        """Does any layer compute in float (an fp32 node, or a weighted layer writing a float island's input)?"""
        return any(getattr(layer, "computes_in_float", False) for layer in self.layers)

    @property
    def input_names(self) -> list[str]:
        """Graph input names, as the float Graph lists them (integer lowering allows one)."""
        return [self.input]

    @property
    def takes_indices(self) -> bool:
        """Is the graph input integer indices (token ids into an embedding table) rather than quantized reals?"""
        return self.input_params == INDICES

    @property
    def input_params(self) -> QuantParams:
        return self.tensors[self.input].params

    @property
    def output_params(self) -> QuantParams:
        return self.tensors[self.output].params

    def require_dtypes(self, target: str, activations: Collection[str], weights: Collection[str] = ("int8",)) -> None:
        """BuildError naming the first layer that reads or writes a tensor whose dtype is not in `activations`,
        or holds weights stored in a numpy type not in `weights` (int8 storage: any width up to 8 bits).

        A target calls it on export for the dtypes its kernels run, so a type its capability does not list
        fails there, by layer and type, instead of running with the wrong range. Integer indices (`INDICES`)
        are no quantized tensor: a target takes them where it writes the embedding layer that reads them."""
        for layer in self.layers:
            for name in (*layer.inputs, *layer.outputs):
                params = self.tensors[name].params if name in self.tensors else None
                dtype = None if params is None or params == INDICES else params.dtype
                if dtype is not None and dtype not in activations:
                    raise BuildError(f"layer {layer.name!r} ({layer.op}): the {target} target cannot run tensor "
                                     f"{name!r} of dtype {dtype} (it runs {', '.join(activations)})")
            weight = getattr(layer, "weight", None)
            if isinstance(weight, np.ndarray) and weight.dtype.name not in weights:
                raise BuildError(f"layer {layer.name!r} ({layer.op}): the {target} target cannot run weights stored "
                                 f"as {weight.dtype.name} (it runs weights stored as {', '.join(weights)})")

    def save(self, directory: Path) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        doc = {
            "format": FORMAT_VERSION,
            "input": self.input,
            "output": self.output,
            "tensors": {name: {"shape": list(t.shape), **t.params.to_json()}
                        for name, t in self.tensors.items()},
            "constants": sorted(self.constants),
            "floats": {name: list(shape) for name, shape in self.floats.items()},
            **({} if self.rounding == "dabuild" else {"rounding": self.rounding}),
            "layers": [{"name": layer.name, "op": layer.op, "inputs": layer.inputs,
                        "outputs": layer.outputs, "attrs": layer.attrs()} for layer in self.layers],
        }
        (directory / QGRAPH_FILE).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        arrays = {f"{layer.name}/{key}": value for layer in self.layers for key, value in layer.arrays().items()}
        arrays.update({_CONSTANT_KEY + name: value for name, value in self.constants.items()})
        write_npz(directory / QWEIGHTS_FILE, arrays)

    @classmethod
    def load(cls, directory: Path) -> QGraph:
        directory = Path(directory)
        doc = json.loads((directory / QGRAPH_FILE).read_text())
        if doc.get("format") != FORMAT_VERSION:
            raise ValueError(f"{directory / QGRAPH_FILE}: unsupported format {doc.get('format')!r}")
        tensors = {name: QTensor(tuple(t["shape"]), QuantParams(t["scale"], t["zero_point"], t["dtype"],
                                                                t.get("rounding", "half_away"),
                                                                t.get("overflow", "saturate")))
                   for name, t in doc["tensors"].items()}
        constants: dict[str, np.ndarray] = {}
        per_layer: dict[str, dict[str, np.ndarray]] = {}
        for key, value in read_npz(directory / QWEIGHTS_FILE, mapped=True).items():
            if key.startswith(_CONSTANT_KEY):
                constants[key[len(_CONSTANT_KEY):]] = value
                continue
            layer_name, _, field_name = key.rpartition("/")
            per_layer.setdefault(layer_name, {})[field_name] = value
        qlayers = [LAYER_TYPES[entry["op"]](name=entry["name"], inputs=entry["inputs"], outputs=entry["outputs"],
                                            **entry["attrs"], **per_layer.get(entry["name"], {}))
                   for entry in doc["layers"]]
        floats = {name: tuple(shape) for name, shape in doc.get("floats", {}).items()}
        return cls(doc["input"], doc["output"], tensors, qlayers, {name: constants[name] for name in doc["constants"]},
                   floats, doc.get("rounding", "dabuild"))
