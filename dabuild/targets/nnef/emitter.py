"""The NNEF document of one export: graph.nnef lines, tensor files, graph.quant entries.

Every QGraph tensor is present in the NNEF graph in one or both of two forms:

- *real*: a float32 tensor whose values lie on the tensor's quantization grid,
  (q - zero_point) * scale, exactly what dabuild's fake-quant reference holds;
- *quantized*: a tract QI8 tensor (tract's own quantized type, declared in
  graph.quant), which tract's integer conv and matmul kernels read and write.

Exporters ask for the form they need (`real`, `quantized`), and the emitter
converts on first request with `tract_core_cast` (which quantizes or
dequantizes by the graph.quant parameters; exact here, since real values lie
on the grid). `fake_quant` puts a float result on its tensor's grid with NNEF
primitives only: clamp(round(v / scale), qmin - zp, qmax - zp) * scale, which
equals dequantize(quantize(v)) (round and clamp commute with adding the
integer zero point).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from dabuild.names import unique_name
from dabuild.qir.qgraph import QGraph, QuantParams

KEYWORDS = frozenset({"version", "extension", "fragment", "graph", "tensor", "integer", "scalar", "logical",
                      "string", "true", "false", "for", "in", "if", "else", "yield", "length_of", "shape_of",
                      "range_of"})


def number(value: float) -> str:
    """A float32 as the shortest NNEF scalar literal that parses back to the same float32."""
    return np.format_float_positional(np.float32(value), unique=True, trim="0")


def integers(values: Iterable[int]) -> str:
    return "[" + ", ".join(str(int(v)) for v in values) + "]"


@dataclass
class Emitter:
    qgraph: QGraph
    lines: list[str] = field(default_factory=list)
    variables: dict[str, tuple[np.ndarray, bool]] = field(default_factory=dict)  # label -> (array, quantized)
    quant: dict[str, QuantParams] = field(default_factory=dict)                  # identifier -> params
    uses_tract_core: bool = False
    _real: dict[str, str] = field(default_factory=dict)
    _quantized: dict[str, str] = field(default_factory=dict)
    _taken: set[str] = field(default_factory=set)

    def fresh(self, base: str) -> str:
        """An unused identifier that reads like `base`."""
        stem = re.sub(r"\W", "_", base) or "t"
        if stem[0].isdigit() or stem in KEYWORDS:
            stem = f"t_{stem}"
        return unique_name(stem, self._taken)

    def assign(self, base: str, expression: str) -> str:
        name = self.fresh(base)
        self.lines.append(f"{name} = {expression};")
        return name

    def call(self, base: str, fragment: str, *args: str, **named: str) -> str:
        if fragment.startswith("tract_core_"):
            self.uses_tract_core = True
        arguments = [*args, *(f"{key} = {value}" for key, value in named.items())]
        return self.assign(base, f"{fragment}({', '.join(arguments)})")

    def variable(self, base: str, array: np.ndarray, params: QuantParams | None = None) -> str:
        """A tensor file and the `variable` reading it; `params` declares integer weights quantized."""
        array = np.asarray(array)
        name = self.fresh(base)
        self.variables[name] = (array, params is not None)
        kind = "scalar" if array.dtype.kind == "f" or params is not None else "integer"
        self.lines.append(f"{name} = variable<{kind}>(shape = {integers(array.shape)}, label = '{name}');")
        if params is not None:
            self.quant[name] = params
        return name

    def external(self, tensor: str, shape: tuple[int, ...], kind: str = "scalar") -> str:
        """The graph input: `scalar` (float32) values, or `integer` (int64) token ids."""
        name = self.fresh(tensor)
        self.lines.append(f"{name} = external<{kind}>(shape = [N{''.join(f', {d}' for d in shape)}]);")
        return name

    # The two forms of a QGraph tensor.
    def set_real(self, tensor: str, name: str) -> None:
        self._real[tensor] = name

    def set_quantized(self, tensor: str, name: str) -> None:
        self._quantized[tensor] = name

    def params(self, tensor: str) -> QuantParams:
        return self.qgraph.tensors[tensor].params

    def real(self, tensor: str) -> str:
        """The float32 form of a QGraph tensor (or graph constant), made on first request."""
        if tensor not in self._real:
            if tensor in self._quantized:
                self.set_real(tensor, self.call(f"{tensor}_real", "tract_core_cast", self._quantized[tensor],
                                                to="'f32'"))
            elif tensor in self.qgraph.constants:
                value = self.qgraph.constants[tensor]
                if tensor in self.qgraph.tensors:  # an int8 constant: its real values
                    value = self.params(tensor).dequantize(value)
                self.set_real(tensor, self.variable(tensor, np.asarray(value, np.float32)))
            else:
                raise KeyError(f"tensor {tensor!r} is read before any layer writes it")
        return self._real[tensor]

    def quantized(self, tensor: str) -> str:
        """The tract QI8 form of a QGraph tensor, made on first request."""
        if tensor not in self._quantized:
            name = self.call(f"{tensor}_q", "tract_core_cast", self.real(tensor), to="'i8'")
            self.quant[name] = self.params(tensor)
            self.set_quantized(tensor, name)
        return self._quantized[tensor]

    def fake_quant(self, value: str, params: QuantParams, base: str, low: int | None = None,
                   high: int | None = None) -> str:
        """`value` on the grid of `params`, clamped to the quantized [low, high] (default the dtype's range)."""
        low = params.qmin if low is None else low
        high = params.qmax if high is None else high
        steps = self.call(f"{base}_steps", "round", self.call(f"{base}_scaled", "div", value, number(params.scale)))
        bounded = self.call(f"{base}_bounded", "clamp", steps, number(low - params.zero_point),
                            number(high - params.zero_point))
        return self.call(base, "mul", bounded, number(params.scale))

    def quant_file(self) -> str:
        return "".join(f'"{name}": zero_point_linear_quantize(zero_point = {p.zero_point}, scale = '
                       f"{number(p.scale)}, bits = 8, signed = {'true' if p.qmin < 0 else 'false'}, "
                       f"symmetric = {'true' if p.zero_point == 0 else 'false'});\n"
                       for name, p in self.quant.items())

    def document(self, inputs: list[str], outputs: list[str]) -> str:
        extensions = ["extension tract_registry tract_core;"] if self.uses_tract_core else []
        body = "".join(f"    {line}\n" for line in self.lines)
        return ("version 1.0;\n" + "".join(f"{line}\n" for line in extensions) + "extension tract_symbol N;\n\n"
                f"graph dabuild({', '.join(inputs)}) -> ({', '.join(outputs)})\n{{\n{body}}}\n")
