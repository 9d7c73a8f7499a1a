"""Given quantization: quantization decided upstream of dabuild (QDQ ONNX, QONNX, Keras QAT layers).

The contract every frontend keeps (the one thing a frontend does about it):

* A quantizer is an IR node of op `fake_quant` (`dabuild/ir/ops/quant.py`) whose
  attributes are a `GivenQuant` (`GivenQuant.attrs()` writes them,
  `GivenQuant.from_attrs` reads them):
  `y = (clip(round(x / scale) + zero_point, qmin, qmax) - zero_point) * scale`
  - `scale`: list of positive floats, one (per tensor) or one per slice of `axis`
    (blocked: negative ones too, as onnxruntime's symmetric MatMulNBits writes
    them so -8 reaches the largest magnitude; the integer path flips their signs);
  - `zero_point`: list of ints of the same length, inside the dtype's range;
  - `bits`, `signed`: the integer type, any width (its name, `dtype`, is e.g.
    int8 or uint4); integer lowering maps it onto dabuild's int2..int16 /
    uint1..uint16 (`dabuild.qir.dtypes`) and refuses other widths naming the
    node and the nearest type; a frontend refuses what is no integer at all
    (float8), naming the node;
  - `axis`: None (per tensor) or the axis the per-channel parameters run along,
    counted on the tensor as the IR sees it (batch axis included for activations);
  - `block_size`, `scale_shape` (weights only; ONNX opset 21 blocked
    DequantizeLinear): 0 and () unless blocked; blocked, `scale` and
    `zero_point` are flattened (C order) over `scale_shape`, which has the
    tensor's rank and, along `axis`, one entry per block of `block_size`
    elements (the last block may be shorter);
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

Fixed-point quantizers (HGQ2's, hls4ml's `ap_fixed`): a node of op `fixed_quant`
whose attributes are a `FixedQuant`: per element of the sample (broadcast from
`shape`) a sign bit k, integer bits i (without the sign) and fractional bits f,
a rounding (ROUNDINGS; `half_up` is HGQ2's and da4ml's RND, `floor` their TRN)
and an overflow (`saturate`, `saturate_symmetric`, `wrap`). It states what the
affine form cannot: a type per element (0 bits: the element is pruned to 0) and
wrap-around. Its semantics are HGQ2's: the value it reads is exact, so in a
graph with fixed_quant nodes every tensor no quantizer fixes keeps its exact
value (the accumulator of a dense or conv, a relu of it), as HGQ2 computes it.

What becomes of the parameters: `dabuild.quant.given_params` turns them into
QuantParams and configs (strategy `given` in `dabuild.tune.given_strategy` keeps them;
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
FIXED_OP = "fixed_quant"
OPS = (OP, FIXED_OP)  # the ops by which a model states its own quantization
ROUNDINGS = ("half_even", "half_away", "half_up", "floor", "ceil", "to_zero")
OVERFLOWS = ("saturate", "saturate_symmetric", "wrap")


def round_values(values: np.ndarray, rounding: str) -> np.ndarray:
    """values rounded to integers by `rounding` (one of ROUNDINGS)."""
    if rounding == "half_even":
        return np.round(values)
    if rounding == "half_away":
        return np.sign(values) * np.floor(np.abs(values) + 0.5)
    if rounding == "half_up":
        return np.floor(values + 0.5)
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
    block_size: int = 0
    scale_shape: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.block_size and (self.axis is None or int(np.prod(self.scale_shape)) != len(self.scale)):
            raise ValueError(f"blocked scales need an axis and a scale_shape of {len(self.scale)} elements "
                             f"(got axis {self.axis}, scale_shape {list(self.scale_shape)})")
        if len(self.scale) != len(self.zero_point) or not self.scale:
            raise ValueError(f"{len(self.scale)} scales but {len(self.zero_point)} zero points")
        if self.rounding not in ROUNDINGS:
            raise ValueError(f"unknown rounding {self.rounding!r} (known: {', '.join(ROUNDINGS)})")
        if not all(np.isfinite(s) and (s > 0 or (s < 0 and self.blocked)) for s in self.scale):
            raise ValueError(f"scales must be positive and finite (negative only in blocks) (got {min(self.scale):g})")
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

    @property
    def blocked(self) -> bool:
        """Scales per block of `block_size` elements along `axis` (and per slice of every other axis)."""
        return self.block_size > 0

    def bounds(self) -> tuple[int, int]:
        """The integer range [qmin, qmax]; narrow: [-qmax, qmax] signed, [0, qmax - 1] unsigned (as QONNX)."""
        if not self.signed:
            return 0, 2**self.bits - 1 - int(self.narrow)
        high = 2 ** (self.bits - 1) - 1
        return (-high if self.narrow else -high - 1), high

    def attrs(self) -> dict[str, Any]:
        """The fake_quant node's attributes (JSON-able)."""
        blocked = {"block_size": self.block_size, "scale_shape": list(self.scale_shape)} if self.blocked else {}
        return {"scale": [float(s) for s in self.scale], "zero_point": [int(z) for z in self.zero_point],
                "bits": self.bits, "signed": self.signed, "axis": self.axis, "narrow": self.narrow, "rounding": self.rounding,
                **blocked}

    @classmethod
    def from_attrs(cls, attrs: dict[str, Any]) -> GivenQuant:
        return cls(tuple(float(s) for s in attrs["scale"]), tuple(int(z) for z in attrs["zero_point"]),
                   int(attrs["bits"]), bool(attrs["signed"]), attrs.get("axis"), bool(attrs.get("narrow", False)),
                   str(attrs.get("rounding", "half_even")), int(attrs.get("block_size") or 0),
                   tuple(int(d) for d in attrs.get("scale_shape") or ()))

    def blocks(self, values: tuple[float, ...] | tuple[int, ...]) -> np.ndarray:
        """A blocked parameter (scale or zero_point) as its array of `scale_shape`."""
        return np.asarray(values, dtype=np.float64).reshape(self.scale_shape)

    def broadcast(self, values: tuple[float, ...] | tuple[int, ...], shape: tuple[int, ...]) -> np.ndarray:
        """A parameter broadcastable against a tensor of `shape` (blocked: repeated over each block)."""
        array = np.asarray(values, dtype=np.float64)
        if self.axis is None:
            return array.reshape(())
        axis = self.axis % len(shape)
        if self.blocked:
            return np.repeat(self.blocks(values), self.block_size, axis=axis).take(range(shape[axis]), axis=axis)
        broadcast = [1] * len(shape)
        broadcast[axis] = -1
        return array.reshape(broadcast)

    def integers(self, x: np.ndarray) -> np.ndarray:
        """The integers x quantizes to (float64 holding integers)."""
        x = np.asarray(x, dtype=np.float64)
        low, high = self.bounds()
        q = round_values(x / self.broadcast(self.scale, x.shape), self.rounding) + self.broadcast(self.zero_point, x.shape)
        return np.clip(q, low, high)

    def fake_quantize(self, x: np.ndarray) -> np.ndarray:
        """x quantized and dequantized, in float32 (what the fake_quant op computes)."""
        shape = np.shape(x)
        centred = self.integers(x) - self.broadcast(self.zero_point, shape)
        return (centred * self.broadcast(self.scale, shape)).astype(np.float32)

    def transposed(self, perm: list[int]) -> GivenQuant:
        """The record of the tensor transposed by `perm` (the channel axis moves with it; blocked scales too)."""
        if self.axis is None:
            return self
        axis = list(perm).index(self.axis % len(perm))
        if not self.blocked:
            return GivenQuant(self.scale, self.zero_point, self.bits, self.signed, axis, self.narrow, self.rounding)
        scale, zero_point = (np.transpose(self.blocks(values), perm) for values in (self.scale, self.zero_point))
        return GivenQuant(tuple(float(s) for s in scale.ravel()), tuple(int(z) for z in zero_point.ravel()),
                          self.bits, self.signed, axis, self.narrow, self.rounding, self.block_size,
                          tuple(int(d) for d in scale.shape))

    def to_json(self) -> dict[str, Any]:
        return self.attrs()


def round_shifted(q: np.ndarray, shift: np.ndarray, rounding: str) -> np.ndarray:
    """Integers q (int64) times 2**-shift, rounded by `rounding`, in exact integer arithmetic (shift >= 0 rounds,
    shift < 0 is an exact left shift). The integer form of `round_values(q * 2.0**-shift, rounding)`."""
    q, shift = np.broadcast_arrays(np.asarray(q, dtype=np.int64), np.asarray(shift, dtype=np.int64))
    right = np.maximum(shift, 0)
    unit = np.left_shift(np.int64(1), right)
    floor = np.floor_divide(q, unit)
    rest = q - floor * unit
    half = unit // 2  # 0 where nothing is dropped: every comparison below is then false
    up = {"floor": np.zeros(q.shape, dtype=bool), "ceil": rest > 0, "half_up": (rest >= half) & (right > 0),
          "to_zero": (q < 0) & (rest > 0),
          "half_away": np.where(q < 0, rest > half, rest >= half) & (right > 0),
          "half_even": ((rest > half) | ((rest == half) & (floor % 2 == 1))) & (right > 0)}[rounding]
    rounded = floor + up
    return np.where(shift >= 0, rounded, np.left_shift(q, np.maximum(-shift, 0)))


@dataclass(frozen=True)
class FixedQuant:
    """A fixed-point quantizer with a type per element (module doc): k, i, f flattened over `shape`, the
    per-sample shape (IR layout) they broadcast to; () is one type for the whole tensor."""

    k: tuple[int, ...]
    i: tuple[int, ...]
    f: tuple[int, ...]
    shape: tuple[int, ...] = ()
    rounding: str = "half_up"
    overflow: str = "wrap"

    def __post_init__(self) -> None:
        size = int(np.prod(self.shape, dtype=np.int64))
        if not len(self.k) == len(self.i) == len(self.f) == size:
            raise ValueError(f"k, i, f have {len(self.k)}, {len(self.i)}, {len(self.f)} values for shape "
                             f"{list(self.shape)} ({size} elements)")
        if self.rounding not in ROUNDINGS:
            raise ValueError(f"unknown rounding {self.rounding!r} (known: {', '.join(ROUNDINGS)})")
        if self.overflow not in OVERFLOWS:
            raise ValueError(f"unknown overflow {self.overflow!r} (known: {', '.join(OVERFLOWS)})")
        if any(k not in (0, 1) for k in self.k):
            raise ValueError("k (the sign bit) must be 0 or 1")

    @classmethod
    def of(cls, k: np.ndarray, i: np.ndarray, f: np.ndarray, rounding: str, overflow: str) -> FixedQuant:
        """From arrays of one shape; i below -f is -f (the quantizer then holds at most the sign)."""
        k, i, f = (np.asarray(a, dtype=np.int64) for a in np.broadcast_arrays(k, i, f))
        i = np.maximum(i, -f)
        def flat(values: np.ndarray) -> tuple[int, ...]:
            return tuple(int(v) for v in values.ravel())

        return cls(flat(k), flat(i), flat(f), tuple(int(d) for d in k.shape), rounding, overflow)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """k, i, f as int64 arrays of `shape`."""
        return tuple(np.asarray(v, dtype=np.int64).reshape(self.shape) for v in (self.k, self.i, self.f))  # type: ignore[return-value]

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """Per element [low, high] in units of 2**-f (HGQ2's: low -2**i with the sign bit, high 2**i - 2**-f)."""
        k, i, f = self.arrays()
        high = np.left_shift(np.int64(1), i + f) - 1
        low = -high if self.overflow == "saturate_symmetric" else -np.left_shift(np.int64(1), i + f)
        return np.where(k == 1, low, 0), high

    @property
    def fractional_bits(self) -> int:
        """F, the finest step 2**-F of any element: the grid the whole tensor lies on."""
        return max(self.f)

    def envelope(self) -> tuple[int, int]:
        """[low, high] of every element's values, in units of 2**-F."""
        low, high = self.bounds()
        _, _, f = self.arrays()
        shift = self.fractional_bits - f
        return int(np.min(np.left_shift(low, shift))), int(np.max(np.left_shift(high, shift)))

    def integers(self, q: np.ndarray, fractional_bits: int) -> np.ndarray:
        """Integers q (batch first, units of 2**-fractional_bits) quantized, in units of 2**-F (int64)."""
        _, _, f = self.arrays()
        n = self._overflowed(round_shifted(np.asarray(q, dtype=np.int64), fractional_bits - f, self.rounding))
        return np.left_shift(n, self.fractional_bits - f)

    def _overflowed(self, n: np.ndarray) -> np.ndarray:
        """Integers n (units of 2**-f per element) wrapped or saturated into each element's range."""
        low, high = self.bounds()
        if self.overflow == "wrap":
            return np.mod(n - low, high - low + 1) + low
        return np.clip(n, low, high)

    def quantize(self, x: np.ndarray) -> np.ndarray:
        """x (float, batch first) on this quantizer's grid, as HGQ2 computes it (float32 out)."""
        x = np.asarray(x, dtype=np.float64)
        _, _, f = self.arrays()
        q = self._overflowed(round_values(x * 2.0**f, self.rounding))
        return (q * 2.0**-f).astype(np.float32)

    def attrs(self) -> dict[str, Any]:
        return {"k": list(self.k), "i": list(self.i), "f": list(self.f), "shape": list(self.shape),
                "rounding": self.rounding, "overflow": self.overflow}

    @classmethod
    def from_attrs(cls, attrs: dict[str, Any]) -> FixedQuant:
        return cls(tuple(int(v) for v in attrs["k"]), tuple(int(v) for v in attrs["i"]),
                   tuple(int(v) for v in attrs["f"]), tuple(int(d) for d in attrs.get("shape", ())),
                   str(attrs.get("rounding", "half_up")), str(attrs.get("overflow", "wrap")))

    def transposed(self, perm: list[int]) -> FixedQuant:
        """The quantizer of the sample transposed by `perm` (per-sample axes)."""
        if not self.shape:
            return self
        k, i, f = (np.transpose(a, perm) for a in self.arrays())
        return FixedQuant.of(k, i, f, self.rounding, self.overflow)


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
