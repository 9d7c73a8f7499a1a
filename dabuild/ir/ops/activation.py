"""Activations: elementwise ops that conv and dense can also apply to their own output.

An `Activation` computes `apply(x, attrs, out)`: with `out=None` it leaves x
alone, with `out=x` it may overwrite x. Conv and dense pass their freshly
computed result as `out`, so a fused activation costs no extra allocation.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from dabuild.ir.ops.base import OPS, REQUIRED, Kernel, Op, OutputSpec, ShapeError, normalize_axis, register

if TYPE_CHECKING:
    from dabuild.ir.graph import TensorSpec


class Activation(Op):
    """An elementwise op of one input that conv/dense may fuse (their `activation` attribute)."""

    per_sample = True

    def shape_rule(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        self.validate(attrs)
        return [(tuple(inputs[0].shape), inputs[0].dtype)]

    in_place = (0,)  # the output has the input's shape and dtype

    def kernel(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        return [self.apply(arrays[0], attrs, None)]

    def prepare(self, attrs: dict[str, Any]) -> Kernel:
        resolved = self.resolve(attrs)
        self.validate(resolved)
        apply = self.apply
        return lambda arrays, out: [apply(arrays[0], resolved, out)]

    def validate(self, attrs: dict[str, Any]) -> None:
        """ShapeError if an attribute value is out of its domain (attrs have every key)."""

    @abstractmethod
    def apply(self, x: np.ndarray, attrs: dict[str, Any], out: np.ndarray | None) -> np.ndarray:
        """The activation of x, written into `out` when given (which may be x itself)."""


def activation_names() -> list[str]:
    """Every op a conv or dense may name in its `activation` attribute, besides "none"."""
    return sorted(name for name, op in OPS.items() if isinstance(op, Activation))


def check_activation(op_name: str, attrs: dict[str, Any]) -> None:
    """ShapeError unless `attrs` names "none" or a known activation with valid `activation_attrs`."""
    name, extra = attrs["activation"], attrs["activation_attrs"]
    if name == "none":
        if extra:
            raise ShapeError(f"{op_name} has activation_attrs {extra} but no activation")
        return
    if not isinstance(OPS.get(name), Activation):
        raise ShapeError(f"{op_name} activation {name!r} is not one of none, {', '.join(activation_names())}")
    activation = OPS[name]
    assert isinstance(activation, Activation)
    activation.validate(activation.resolve(extra))


def fused_activation(attrs: dict[str, Any]) -> Callable[[np.ndarray], np.ndarray]:
    """The activation named in a conv/dense's attrs, as a function that applies it in place to the op's own result.

    Resolved once per call, so conv can apply it block by block while each block is still in cache.
    """
    name = attrs["activation"]
    if name == "none":
        return _unchanged
    op = OPS[name]
    assert isinstance(op, Activation)
    resolved = op.resolve(attrs["activation_attrs"])
    return lambda y: op.apply(y, resolved, y)


def _unchanged(y: np.ndarray) -> np.ndarray:
    return y


@register
class Relu(Activation):
    name = "relu"

    def apply(self, x: np.ndarray, attrs: dict[str, Any], out: np.ndarray | None) -> np.ndarray:
        if x.size < len(_ZEROS) or x.dtype != np.float32:
            return np.maximum(x, 0, out=out)
        y = np.empty_like(x) if out is None else out  # empty_like keeps x's memory order
        source, target = _flat(x), _flat(y)
        if source is None or target is None or y.strides != x.strides:
            return np.maximum(x, 0, out=out)
        # numpy's maximum against a scalar has no SIMD loop; against a contiguous row of zeros it has.
        whole = len(source) - len(source) % len(_ZEROS)
        np.maximum(source[:whole].reshape(-1, len(_ZEROS)), _ZEROS, out=target[:whole].reshape(-1, len(_ZEROS)))
        np.maximum(source[whole:], 0, out=target[whole:])
        return y


_ZEROS = np.zeros(4096, np.float32)


def _flat(x: np.ndarray) -> np.ndarray | None:
    """x's elements as a 1-D view in memory order, or None if they are not one contiguous run."""
    flat = x.ravel(order="K")
    return flat if np.may_share_memory(flat, x) else None


@register
class Relu6(Activation):
    name = "relu6"
    rule = "same shape as x; min(max(x, 0), 6)"

    def apply(self, x: np.ndarray, attrs: dict[str, Any], out: np.ndarray | None) -> np.ndarray:
        return np.clip(x, 0, 6, out=out)


@register
class LeakyRelu(Activation):
    name = "leaky_relu"
    defaults = {"alpha": 0.01}
    rule = "same shape as x; x if x >= 0 else alpha * x"

    def apply(self, x: np.ndarray, attrs: dict[str, Any], out: np.ndarray | None) -> np.ndarray:
        y = x.copy() if out is None else out
        return np.multiply(y, np.float32(attrs["alpha"]), out=y, where=x < 0)


@register
class Sigmoid(Activation):
    name = "sigmoid"

    def apply(self, x: np.ndarray, attrs: dict[str, Any], out: np.ndarray | None) -> np.ndarray:
        # 1 / (1 + exp(-x)) overflows exp for large -x; the tanh form is the same function without that.
        y = np.multiply(x, 0.5, out=out)
        np.tanh(y, out=y)
        y *= 0.5
        y += 0.5
        return y


@register
class Tanh(Activation):
    name = "tanh"

    def apply(self, x: np.ndarray, attrs: dict[str, Any], out: np.ndarray | None) -> np.ndarray:
        return np.tanh(x, out=out)


@register
class HardSigmoid(Activation):
    """ONNX's HardSigmoid; torch's nn.Hardsigmoid is alpha=1/6, beta=0.5."""

    name = "hard_sigmoid"
    defaults = {"alpha": 0.2, "beta": 0.5}
    rule = "same shape as x; max(0, min(1, alpha * x + beta))"

    def apply(self, x: np.ndarray, attrs: dict[str, Any], out: np.ndarray | None) -> np.ndarray:
        y = np.multiply(x, np.float32(attrs["alpha"]), out=out)
        y += np.float32(attrs["beta"])
        return np.clip(y, 0, 1, out=y)


@register
class HardSwish(Activation):
    name = "hard_swish"
    rule = "same shape as x; x * relu6(x + 3) / 6"

    def apply(self, x: np.ndarray, attrs: dict[str, Any], out: np.ndarray | None) -> np.ndarray:
        gate = np.add(x, 3)
        np.clip(gate, 0, 6, out=gate)
        gate *= 1 / 6
        return np.multiply(x, gate, out=out)


def _erf(z: np.ndarray) -> np.ndarray:
    """erf elementwise (numpy has none): Abramowitz & Stegun 7.1.26, |error| < 1.5e-7, below float32's step at 1."""
    t = 1 / (1 + 0.3275911 * np.abs(z))
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return np.copysign(1 - poly * np.exp(-z * z), z)


class Elementwise(Activation):
    """An activation that is one numpy expression of x (`function`), computed in x's float type."""

    def apply(self, x: np.ndarray, attrs: dict[str, Any], out: np.ndarray | None) -> np.ndarray:
        y = np.asarray(self.function(x, attrs), dtype=x.dtype)
        if out is None:
            return y
        out[...] = y
        return out

    @abstractmethod
    def function(self, x: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
        """The activation of x as a new array."""


@register
class Elu(Elementwise):
    name = "elu"
    defaults = {"alpha": 1.0}
    rule = "same shape as x; x if x > 0 else alpha * (exp(x) - 1)"

    def function(self, x: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
        return np.where(x > 0, x, np.float32(attrs["alpha"]) * np.expm1(np.minimum(x, 0)))


@register
class Selu(Elementwise):
    """ONNX's Selu; its defaults are torch's nn.SELU constants."""

    name = "selu"
    defaults = {"alpha": 1.67326319217681884765625, "gamma": 1.05070102214813232421875}
    rule = "same shape as x; gamma * (x if x > 0 else alpha * (exp(x) - 1))"

    def function(self, x: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
        negative = np.float32(attrs["alpha"]) * np.expm1(np.minimum(x, 0))
        return np.float32(attrs["gamma"]) * np.where(x > 0, x, negative)


@register
class Softplus(Elementwise):
    """log(1 + exp(x)), written so exp never overflows."""

    name = "softplus"
    rule = "same shape as x; log(1 + exp(x))"

    def function(self, x: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
        return np.logaddexp(x, np.float32(0))


@register
class Softsign(Elementwise):
    name = "softsign"
    rule = "same shape as x; x / (1 + |x|)"

    def function(self, x: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
        return x / (1 + np.abs(x))


def _numpy_unary(op_name: str, ufunc: np.ufunc, formula: str) -> type[Elementwise]:
    """An activation that is one numpy ufunc (abs, neg, exp, ...): one line each instead of a class each."""

    def function(self: Elementwise, x: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):  # log(0), 1/0, sqrt(-1): inf and nan as ONNX gives
            return ufunc(x)

    cls = type(op_name.title(), (Elementwise,), {"name": op_name, "rule": f"same shape as x; {formula}",
                                                 "function": function, "__module__": __name__})
    return register(cls)  # type: ignore[return-value]


for _name, _ufunc, _formula in (("abs", np.abs, "|x|"), ("neg", np.negative, "-x"), ("exp", np.exp, "e**x"),
                                ("log", np.log, "natural log of x"), ("sqrt", np.sqrt, "square root of x"),
                                ("reciprocal", np.reciprocal, "1 / x")):
    _numpy_unary(_name, _ufunc, _formula)


@register
class Pow(Elementwise):
    """x to a constant power (ONNX Pow with a known scalar exponent, torch's pow.Tensor_Scalar)."""

    name = "pow"
    defaults = {"exponent": REQUIRED}
    rule = "same shape as x; x ** exponent"

    def function(self, x: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
        exponent = float(attrs["exponent"])
        if exponent == 2:
            return x * x
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.power(x, np.float32(exponent))


@register
class Erf(Elementwise):
    name = "erf"
    rule = "same shape as x; the error function"

    def function(self, x: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
        return _erf(x)


@register
class Gelu(Activation):
    """GELU, exact (x * Phi(x)) or with the tanh approximation ("tanh"), as ONNX and torch define both."""

    name = "gelu"
    defaults = {"approximate": "none"}
    rule = 'same shape as x; approximate "none" or "tanh"'

    def apply(self, x: np.ndarray, attrs: dict[str, Any], out: np.ndarray | None) -> np.ndarray:
        if attrs["approximate"] == "tanh":
            inner = np.tanh(np.float32(math.sqrt(2 / math.pi)) * (x + np.float32(0.044715) * x * x * x))
        else:
            inner = _erf(x * np.float32(1 / math.sqrt(2)))
        inner += 1
        inner *= 0.5
        return np.multiply(x, inner, out=out)

    def validate(self, attrs: dict[str, Any]) -> None:
        if attrs["approximate"] not in ("none", "tanh"):
            raise ShapeError(f"gelu approximate must be 'none' or 'tanh', got {attrs['approximate']!r}")


@register
class Clip(Activation):
    """Clamp to [min, max]; a missing (None) bound does not clamp."""

    name = "clip"
    defaults = {"min": None, "max": None}
    rule = "same shape as x; min(max(x, min), max)"

    def apply(self, x: np.ndarray, attrs: dict[str, Any], out: np.ndarray | None) -> np.ndarray:
        low = -np.inf if attrs["min"] is None else attrs["min"]
        high = np.inf if attrs["max"] is None else attrs["max"]
        return np.clip(x, np.float32(low), np.float32(high), out=out)


@register
class Softmax(Op):
    """Softmax along `axis`, shifted by the max for stability (not fusable: it is not elementwise)."""

    name = "softmax"
    defaults = {"axis": -1}
    rule = "same shape as x"

    def samplewise(self, attrs: dict[str, Any]) -> bool:
        """Normalising along any axis but the batch."""
        attrs = self.resolve(attrs)
        return attrs["axis"] != 0

    def shape_rule(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        normalize_axis(attrs["axis"], len(inputs[0].shape), "softmax")
        return [(tuple(inputs[0].shape), inputs[0].dtype)]

    def kernel(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        axis = attrs["axis"]
        shifted = np.exp(arrays[0] - arrays[0].max(axis=axis, keepdims=True))
        shifted /= shifted.sum(axis=axis, keepdims=True)
        return [shifted]


@register
class LogSoftmax(Op):
    """log(softmax(x)) along `axis`, as x - max - log(sum(exp(x - max))) (never log of an underflowed 0)."""

    name = "log_softmax"
    defaults = {"axis": -1}
    rule = "same shape as x"

    def shape_rule(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        normalize_axis(attrs["axis"], len(inputs[0].shape), "log_softmax")
        return [(tuple(inputs[0].shape), inputs[0].dtype)]

    def kernel(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        axis = attrs["axis"]
        shifted = arrays[0] - arrays[0].max(axis=axis, keepdims=True)
        return [shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))]
