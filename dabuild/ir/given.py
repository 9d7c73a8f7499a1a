"""Given quantization: quantization decided upstream of dabuild (QDQ ONNX, QONNX, Keras QAT layers).

The contract every frontend keeps (the one thing a frontend does about it):

* A quantizer is an IR node of op `fake_quant` (`dabuild/ir/ops/quant.py`) whose
  attributes are a `GivenQuant` (`GivenQuant.attrs()` writes them,
  `GivenQuant.from_attrs` reads them):
  `y = (clip(round(x / scale) + zero_point, qmin, qmax) - zero_point) * scale`
  - `scale`: list of positive floats, one (per tensor) or one per slice of `axis`;
  - `zero_point`: list of ints of the same length, inside the dtype's range;
  - `bits`, `signed`: the integer type, any width (its name, `dtype`, is e.g.
    int8 or uint4); integer lowering maps it onto dabuild's int2..int16 /
    uint1..uint16 (`dabuild.quant.dtypes`) and refuses other widths naming the
    node and the nearest type; a frontend refuses what is no integer at all
    (float8), naming the node;
  - `axis`: None (per tensor) or the axis the per-channel parameters run along,
    counted on the tensor as the IR sees it (batch axis included for activations);
  - `narrow`: True for the symmetric signed range [-qmax, qmax] (unsigned: [0, qmax - 1]);
  - `rounding`: one of ROUNDINGS (`half_even` is ONNX QuantizeLinear's and
    QONNX `ROUND`; `half_away` is dabuild's own).
* Over an activation the node stays in the graph: the float interpreter runs it,
  so calibration and the float baseline see the model as it was quantized
  (a Relu that onnxruntime's quantizer removed lives on in a zero point), and
  integer lowering takes its parameters as the tensor's QuantParams instead of
  calibrating them. Every reader of the fake_quant's input sees the quantized
  tensor once lowered.
* Over a constant it is a weight quantizer: `dabuild.ir.passes.fold_constants`
  folds it into a constant whose values lie on the grid and records the
  parameters in `Graph.given[constant name]`. An identity or transpose folded over such a
  constant carries the record along (its axis permuted); a pass that makes a
  new constant out of it otherwise (a batch norm folded into the weights)
  drops the record, and the new weight is quantized by tuning.
* A fake_quant over the output of another fake_quant with other parameters
  quantizes twice: `check_given` refuses the graph naming both nodes, rather
  than merge them silently.

What becomes of the parameters: `dabuild.quant.given` turns them into
QuantParams and configs (strategy `given` in `dabuild.tune.given` keeps them;
other strategies tune only what the model left in float), and refuses what the
integer path cannot represent, naming the node, the parameter and the nearest
representable choice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from dabuild.errors import BuildError

OP = "fake_quant"
ROUNDINGS = ("half_even", "half_away", "floor", "ceil", "to_zero")


def _round(values: np.ndarray, rounding: str) -> np.ndarray:
    if rounding == "half_even":
        return np.round(values)
    if rounding == "half_away":
        return np.sign(values) * np.floor(np.abs(values) + 0.5)
    if rounding == "floor":
        return np.floor(values)
    if rounding == "ceil":
        return np.ceil(values)
    return np.trunc(values)


@dataclass(frozen=True)
class GivenQuant:
    """One tensor's upstream quantization (module doc); per channel along `axis` when it is not None."""

    scale: tuple[float, ...]
    zero_point: tuple[int, ...]
    bits: int
    signed: bool
    axis: int | None = None
    narrow: bool = False
    rounding: str = "half_even"

    def __post_init__(self) -> None:
        if len(self.scale) != len(self.zero_point) or not self.scale:
            raise ValueError(f"{len(self.scale)} scales but {len(self.zero_point)} zero points")
        if self.rounding not in ROUNDINGS:
            raise ValueError(f"unknown rounding {self.rounding!r} (known: {', '.join(ROUNDINGS)})")
        if not all(np.isfinite(s) and s > 0 for s in self.scale):
            raise ValueError(f"scales must be positive and finite (got {min(self.scale):g})")
        if self.bits < 1:
            raise ValueError(f"bit width {self.bits} is not positive")
        if self.axis is None and len(self.scale) != 1:
            raise ValueError(f"{len(self.scale)} scales need an axis")

    @property
    def dtype(self) -> str:
        """The type's name: int8, uint4, ..."""
        return f"{'' if self.signed else 'u'}int{self.bits}"

    @property
    def per_channel(self) -> bool:
        return self.axis is not None

    def bounds(self) -> tuple[int, int]:
        """The integer range [qmin, qmax]; narrow: [-qmax, qmax] signed, [0, qmax - 1] unsigned (as QONNX)."""
        if not self.signed:
            return 0, 2**self.bits - 1 - int(self.narrow)
        high = 2 ** (self.bits - 1) - 1
        return (-high if self.narrow else -high - 1), high

    def attrs(self) -> dict[str, Any]:
        """The fake_quant node's attributes (JSON-able)."""
        return {"scale": [float(s) for s in self.scale], "zero_point": [int(z) for z in self.zero_point],
                "bits": self.bits, "signed": self.signed, "axis": self.axis, "narrow": self.narrow, "rounding": self.rounding}

    @classmethod
    def from_attrs(cls, attrs: dict[str, Any]) -> GivenQuant:
        return cls(tuple(float(s) for s in attrs["scale"]), tuple(int(z) for z in attrs["zero_point"]),
                   int(attrs["bits"]), bool(attrs["signed"]), attrs.get("axis"), bool(attrs.get("narrow", False)),
                   str(attrs.get("rounding", "half_even")))

    def _shaped(self, values: tuple[float, ...] | tuple[int, ...], ndim: int) -> np.ndarray:
        array = np.asarray(values, dtype=np.float64)
        if self.axis is None:
            return array.reshape(())
        shape = [1] * ndim
        shape[self.axis % ndim] = -1
        return array.reshape(shape)

    def integers(self, x: np.ndarray) -> np.ndarray:
        """The integers x quantizes to (float64 holding integers)."""
        x = np.asarray(x, dtype=np.float64)
        low, high = self.bounds()
        q = _round(x / self._shaped(self.scale, x.ndim), self.rounding) + self._shaped(self.zero_point, x.ndim)
        return np.clip(q, low, high)

    def fake_quantize(self, x: np.ndarray) -> np.ndarray:
        """x quantized and dequantized, in float32 (what the fake_quant op computes)."""
        ndim = np.ndim(x)
        centred = self.integers(x) - self._shaped(self.zero_point, ndim)
        return (centred * self._shaped(self.scale, ndim)).astype(np.float32)

    def transposed(self, perm: list[int]) -> GivenQuant:
        """The record of the tensor transposed by `perm` (the channel axis moves with it)."""
        if self.axis is None:
            return self
        return GivenQuant(self.scale, self.zero_point, self.bits, self.signed, list(perm).index(self.axis % len(perm)),
                          self.narrow, self.rounding)

    def to_json(self) -> dict[str, Any]:
        return self.attrs()


def check_given(nodes: list[Any]) -> None:
    """BuildError when a fake_quant reads another fake_quant's output under other parameters (quantizes twice)."""
    writers = {out: node for node in nodes if node.op == OP for out in node.outputs}
    for node in nodes:
        if node.op != OP or node.inputs[0] not in writers:
            continue
        first = writers[node.inputs[0]]
        if GivenQuant.from_attrs(first.attrs) != GivenQuant.from_attrs(node.attrs):
            raise BuildError(
                f"node {node.name!r} (fake_quant) quantizes tensor {node.inputs[0]!r} a second time, with other "
                f"parameters than node {first.name!r} did ({_describe(node.attrs)} after {_describe(first.attrs)}); "
                "dabuild does not merge the two: quantize once, or keep a layer between them")


def _describe(attrs: dict[str, Any]) -> str:
    scales = attrs["scale"]
    scale = f"scale {scales[0]:g}" if len(scales) == 1 else f"{len(scales)} scales"
    kind = f"{'' if attrs['signed'] else 'u'}int{attrs['bits']}"
    return f"{kind} {scale} zero point {attrs['zero_point'][0]}"
