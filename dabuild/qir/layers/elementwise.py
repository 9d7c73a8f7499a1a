"""Elementwise layers: clamps, lookup tables, and add/sub/mul of two integer tensors.

relu keeps its input's params and clamps at the zero point; relu6 and clip
keep them too and clamp at their quantized bounds (exact up to the rounding
of the bounds). Every other activation is a table with one entry per value
of the input's dtype (256 for int8; see `dabuild.qir.activations`).

add/sub follow TFLite: both inputs, centred, are shifted left by LEFT_SHIFT
bits and each scaled to the common scale 2 * max(s_a, s_b) / 2**LEFT_SHIFT
(multipliers <= 1/2, so no bit is lost at int8), added in int32 (int64 for
inputs wider than 8 bits), and the sum requantized to the output. mul requantizes the int32 product of the centred
inputs by s_a * s_b / s_y. A constant operand is quantized with its own exact
min/max into an integer graph constant. Inputs broadcast as numpy does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from dabuild.ir.kernels.native import layer_thread_count, native_conv
from dabuild.qir.fixed_point import accumulator_trace, requantize
from dabuild.qir.qgraph import QGraph, QLayer, Trace, layer_type

PAIR_TABLES: dict[tuple[object, ...], np.ndarray] = {}  # QAdd's 64 KiB look-up tables by what they depend on


PAIR_TABLES_KEPT = 256  # at most 16 MiB of them


LEFT_SHIFT = 20  # |x - zp| <= 255 < 2**8, so the shifted inputs stay below 2**28 and their sum below 2**29


@layer_type
@dataclass
class QClamp(QLayer):
    """min(max(x, low), high) in the input's own quantized domain; the output keeps the input's params."""

    op: ClassVar[str] = "clamp"
    low: int
    high: int

    def run(self, inputs: list[np.ndarray], graph: QGraph, trace: Trace | None) -> list[np.ndarray]:
        return [np.clip(inputs[0], self.low, self.high).astype(inputs[0].dtype, copy=False)]


@layer_type
@dataclass
class QRelu(QClamp):
    """A clamp at [zero point, qmax]: its own op so targets can give it the cheapest kernel."""

    op: ClassVar[str] = "relu"


@layer_type
@dataclass
class QLookup(QLayer):
    """y = table[x - qmin]: any function of one integer value."""

    op: ClassVar[str] = "lookup"
    function: str       # the float op the table was computed from, for reports
    table: np.ndarray   # (input levels,) in the output's storage: 256 int8 for int8 -> int8

    def run(self, inputs: list[np.ndarray], graph: QGraph, trace: Trace | None) -> list[np.ndarray]:
        return [self.table[inputs[0].astype(np.int64) - self.params(graph).qmin]]


@layer_type
@dataclass
class QAdd(QLayer):
    """a + b rescaled to a common scale (TFLite), requantized to the output."""

    op: ClassVar[str] = "add"
    sign: ClassVar[int] = 1
    left_shift: int
    input_multiplier: np.ndarray  # int32 (2,): s_a / (2 max(s_a, s_b)), s_b / (2 max(s_a, s_b))
    input_shift: np.ndarray       # int32 (2,)
    multiplier: np.ndarray        # int32 (1,): 2 max(s_a, s_b) / (2**left_shift * s_y)
    shift: np.ndarray             # int32 (1,)

    def run(self, inputs: list[np.ndarray], graph: QGraph, trace: Trace | None) -> list[np.ndarray]:
        return self.run_clamped(inputs, graph, None) if trace is None else self._reference(inputs, graph, trace)

    def run_clamped(self, inputs: list[np.ndarray], graph: QGraph, clamp: QClamp | None) -> list[np.ndarray]:
        """The output, then `clamp` (a clamp layer reading it, or None) applied to it: for 8-bit tensors one
        look-up of a table that holds both, so the relu after a residual add costs no pass of its own."""
        native = native_conv()
        if (native is not None and native.integer is not None and inputs[0].shape == inputs[1].shape
                and all(np.dtype(params.storage).itemsize == 1
                        for params in (self.params(graph, 0), self.params(graph, 1), self.output_params(graph)))):
            a, b = (np.asarray(x).view(np.uint8) for x in inputs)
            table = self._pair_table(graph, clamp)
            return [native.integer.add_lookup(a, b, table, layer_thread_count()).view(self.output_params(graph).storage)]
        [y] = self._reference(inputs, graph, None)
        return [y] if clamp is None else clamp.run([y], graph, None)

    def _pair_table(self, graph: QGraph, clamp: QClamp | None = None) -> np.ndarray:
        """The output byte for every pair of input bytes (a * 256 + b), by the numpy reference (and `clamp`'s):
        with 8-bit inputs and output the layer is a function of two bytes, which the compiled add looks up.
        Kept by everything it depends on (PAIR_TABLES), so the trials of a tuning run, whose configs lower
        each add anew, mostly find it made."""
        key = (type(self), self.left_shift, *(tuple(int(v) for v in values) for values in (
            self.input_multiplier, self.input_shift, self.multiplier, self.shift)),
            self.params(graph, 0), self.params(graph, 1), self.output_params(graph),
            None if clamp is None else (clamp.low, clamp.high), graph.rounding)
        table = PAIR_TABLES.get(key)
        if table is None:
            every = np.arange(256, dtype=np.uint8)
            a, b = (np.repeat(every, 256), np.tile(every, 256))
            stored = [x.view(self.params(graph, index).storage).reshape(256, 256) for index, x in enumerate((a, b))]
            [y] = self._reference(stored, graph, None)
            if clamp is not None:
                [y] = clamp.run([y], graph, None)
            table = y.view(np.uint8).ravel()
            table.flags.writeable = False
            if len(PAIR_TABLES) >= PAIR_TABLES_KEPT:
                del PAIR_TABLES[next(iter(PAIR_TABLES))]  # the oldest
            PAIR_TABLES[key] = table
        return table

    def _reference(self, inputs: list[np.ndarray], graph: QGraph, trace: Trace | None) -> list[np.ndarray]:
        a, b = (self._rescaled(graph, i, x) for i, x in enumerate(inputs))
        total = a + self.sign * b
        if trace is not None:
            trace[f"{self.name}:accumulator"] = accumulator_trace(total.astype(np.int64))
        target = self.output_params(graph)
        native = native_conv()
        if (native is not None and trace is None and total.ndim >= 2 and total.dtype == np.float64
                and graph.rounding == "dabuild"):  # compiled
            y = native.requantize(total, 1, np.zeros(total.shape[1], np.int64), self.multiplier,
                                  self.shift, int(target.zero_point), target.qmin, target.qmax)
            if y is not None:
                return [y.astype(target.storage)]
        total = total.astype(np.int64)
        return [target.saturate(requantize(total, self.multiplier, self.shift, graph.rounding) + target.zero_point)]

    def _rescaled(self, graph: QGraph, index: int, x: np.ndarray) -> np.ndarray:
        """Input `index` at the common scale: (q - zero point) << left_shift, requantized by its multiplier.

        A function of q alone, so an 8-bit input looks its result up in a table indexed by its byte (as
        float64: the values, and the sum of two, are integers far below 2**53).
        """
        params = self.params(graph, index)

        def rescale(q: np.ndarray) -> np.ndarray:
            return requantize(params.centred(q) << self.left_shift, self.input_multiplier[index],
                              self.input_shift[index], graph.rounding)

        if np.dtype(params.storage).itemsize > 1:
            return rescale(x)
        as_stored = np.arange(256, dtype=np.uint8).view(params.storage)  # the value each byte holds
        table = rescale(np.clip(as_stored, params.qmin, params.qmax)).astype(np.float64)
        return table[np.asarray(x, params.storage).view(np.uint8)]


@layer_type
@dataclass
class QSub(QAdd):
    """a - b, as add with the second term negated."""

    op: ClassVar[str] = "sub"
    sign: ClassVar[int] = -1


@layer_type
@dataclass
class QMul(QLayer):
    """(a - za) * (b - zb) in int32, requantized by s_a * s_b / s_y."""

    op: ClassVar[str] = "mul"
    multiplier: np.ndarray  # int32 (1,)
    shift: np.ndarray       # int32 (1,)

    def run(self, inputs: list[np.ndarray], graph: QGraph, trace: Trace | None) -> list[np.ndarray]:
        product = self.params(graph, 0).centred(inputs[0]) * self.params(graph, 1).centred(inputs[1])
        if trace is not None:
            trace[f"{self.name}:accumulator"] = accumulator_trace(product)
        target = self.output_params(graph)
        return [target.saturate(requantize(product, self.multiplier, self.shift, graph.rounding) + target.zero_point)]


@layer_type
@dataclass
class QPrelu(QLayer):
    """x * s_x / s_y where x >= 0, else x * slope * s_x / s_y, with one (broadcast) slope per position of
    `sign` (a constant slope tensor, usually one per channel): both branches are requantizations of the centred
    input, the negative one by |slope| s_x / s_y and then the slope's sign (0 for a zero slope)."""

    op: ClassVar[str] = "prelu"
    multiplier: np.ndarray           # int32 (1,): s_x / s_y, the positive branch
    shift: np.ndarray                # int32 (1,)
    negative_multiplier: np.ndarray  # int32, the slope's shape: |slope| s_x / s_y (any valid value where 0)
    negative_shift: np.ndarray       # int32, the slope's shape
    sign: np.ndarray                 # int32, the slope's shape: -1, 0 or 1

    def run(self, inputs: list[np.ndarray], graph: QGraph, trace: Trace | None) -> list[np.ndarray]:
        centred = self.params(graph).centred(inputs[0])
        positive = requantize(centred, self.multiplier, self.shift, graph.rounding)
        negative = self.sign * requantize(centred, self.negative_multiplier, self.negative_shift, graph.rounding)
        target = self.output_params(graph)
        return [target.saturate(np.where(centred >= 0, positive, negative) + target.zero_point)]
