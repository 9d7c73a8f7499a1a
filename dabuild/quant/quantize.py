"""Integer lowering: Graph + Stats + QuantConfig -> QGraph.

One lowering function per op type (a registry, like the interpreter's ops).
Activation tensors get their quantization from the node that produces them;
the graph input takes the activation choice of its first consumer. Each
choice's calibration algorithm picks the range from the stored statistics;
weights, known exactly, get theirs from a histogram of the weight itself.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dabuild.errors import BuildError
from dabuild.ir.graph import Graph, Node
from dabuild.quant.algorithms import ALGORITHMS
from dabuild.quant.calibrate import Stats
from dabuild.quant.config import NodeConfig, QuantChoice, QuantConfig
from dabuild.quant.qgraph import INT_RANGES, QDense, QGraph, QLayer, QRelu, QTensor, QuantParams, round_half_away

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
MAX_SHIFT = 62  # keeps |acc * multiplier| + rounding term inside int64


def _require(choice: QuantChoice, where: str, *, scheme: tuple[str, ...], granularity: tuple[str, ...]) -> None:
    """Fail clearly on a choice the integer lowering cannot honour yet."""
    problems = []
    if choice.dtype not in INT_RANGES:
        problems.append(f"dtype {choice.dtype!r}")
    if choice.scheme not in scheme:
        problems.append(f"scheme {choice.scheme!r}")
    if choice.granularity not in granularity:
        problems.append(f"granularity {choice.granularity!r}")
    if choice.algorithm not in ALGORITHMS:
        problems.append(f"calibration algorithm {choice.algorithm!r}")
    if problems:
        raise BuildError(f"{where}: integer lowering does not support {', '.join(problems)} yet")


def activation_params(low: float, high: float, choice: QuantChoice, where: str) -> QuantParams:
    """Scale and zero point covering [low, high] and always 0 (so zero padding and relu are exact)."""
    _require(choice, where, scheme=("asym", "sym"), granularity=("per_tensor",))
    qmin, qmax = INT_RANGES[choice.dtype]
    low, high = min(low, 0.0), max(high, 0.0)
    if choice.scheme == "sym":
        scale = max(-low, high) / qmax
        return QuantParams(scale if scale > 0 else 1.0, 0, choice.dtype)
    scale = (high - low) / (qmax - qmin)
    if scale == 0:
        return QuantParams(1.0, 0, choice.dtype)
    zero_point = int(np.clip(qmin - round_half_away(np.float64(low / scale)), qmin, qmax))
    return QuantParams(float(scale), zero_point, choice.dtype)


def weight_peaks(weight: np.ndarray, choice: QuantChoice) -> np.ndarray:
    """The clipping magnitude of (in, out) dense weights: shape (1,) per tensor, (out,) per channel.

    minmax takes the exact largest magnitude; other algorithms read a histogram of the weight.
    """
    per_tensor = choice.granularity == "per_tensor"
    if choice.algorithm == "minmax":
        return np.atleast_1d(np.max(np.abs(weight.astype(np.float64)), axis=None if per_tensor else 0))
    stats = Stats()
    stats.observe("weight", weight, axis=1)
    if per_tensor:
        return np.array([stats.range("weight", choice.algorithm, "sym", choice.dtype)[1]])
    return stats.channel_ranges("weight", choice.algorithm, "sym", choice.dtype)[1]


def quantize_weight(weight: np.ndarray, choice: QuantChoice, where: str) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 weights and their scales: shape (1,) per tensor, (out_features,) per channel."""
    _require(choice, where, scheme=("sym",), granularity=("per_tensor", "per_channel"))
    qmax = INT_RANGES[choice.dtype][1]
    peak = weight_peaks(weight, choice)
    scales = np.where(peak > 0, peak / qmax, 1.0)
    q = np.clip(round_half_away(weight / scales), -qmax, qmax).astype(choice.dtype)
    return q, scales


def quantize_multiplier(real: np.ndarray, where: str) -> tuple[np.ndarray, np.ndarray]:
    """real ≈ multiplier * 2**-shift with a Q31 multiplier in [2**30, 2**31)."""
    mantissa, exponent = np.frexp(real)
    multiplier = round_half_away(mantissa * 2.0**31).astype(np.int64)
    carry = multiplier == 2**31
    multiplier[carry] //= 2
    exponent = exponent + carry
    shift = 31 - exponent.astype(np.int64)
    if np.any(shift < 1):
        raise BuildError(f"{where}: requantization multiplier {real.max():g} is too large (>= 2**30)")
    # Tiny multipliers: drop mantissa bits rather than shift past int64 (the result rounds to 0 anyway).
    excess = np.maximum(shift - MAX_SHIFT, 0)
    multiplier = round_half_away(multiplier / 2.0**excess).astype(np.int64)
    return multiplier.astype(np.int32), np.minimum(shift, MAX_SHIFT).astype(np.int32)


def _range(stats: Stats, tensor: str, choice: QuantChoice, where: str) -> tuple[float, float]:
    """The activation range the choice's calibration algorithm derives from the stored statistics."""
    if tensor not in stats.ranges:
        raise BuildError(f"{where}: no calibration range for tensor {tensor!r}; recalibrate with this graph")
    _require(choice, where, scheme=("asym", "sym"), granularity=("per_tensor",))
    return stats.range(tensor, choice.algorithm, choice.scheme, choice.dtype)


def _constant(graph: Graph, name: str, where: str) -> np.ndarray:
    if name not in graph.constants:
        raise BuildError(f"{where}: input {name!r} must be a constant for integer lowering")
    return np.asarray(graph.constants[name])


def _lower_dense(node: Node, graph: Graph, tensors: dict[str, QTensor], stats: Stats, cfg: NodeConfig) -> QLayer:
    where = f"node {node.name!r} (dense)"
    source = tensors[node.inputs[0]]
    weight = _constant(graph, node.inputs[1], where)
    bias = _constant(graph, node.inputs[2], where) if len(node.inputs) > 2 else np.zeros(weight.shape[1])
    out_params = activation_params(*_range(stats, node.outputs[0], cfg.activation, where), cfg.activation, where)
    tensors[node.outputs[0]] = QTensor((weight.shape[1],), out_params)

    weight_q, weight_scale = quantize_weight(weight, cfg.weight, where)
    accumulator_scale = source.params.scale * weight_scale
    bias_q = round_half_away(bias.astype(np.float64) / accumulator_scale)
    # Worst |accumulator| over every int8 input: |bias| + sum |w| * 255; int32 overflow in C is undefined.
    qmin, qmax = INT_RANGES[source.params.dtype]
    worst = np.abs(bias_q) + np.abs(weight_q.astype(np.int64)).sum(axis=0) * (qmax - qmin)
    if np.any(worst > INT32_MAX):
        raise BuildError(f"{where}: the int32 accumulator could overflow (worst case {int(worst.max())}); "
                         "the bias or the number of input features is too large for int8 x int8 -> int32")
    multiplier, shift = quantize_multiplier(accumulator_scale / out_params.scale, where)
    return QDense(name=node.name, inputs=[node.inputs[0]], outputs=list(node.outputs),
                  weight=weight_q, bias=bias_q.astype(np.int32), multiplier=multiplier, shift=shift,
                  weight_scale=weight_scale, relu=node.attrs.get("activation", "none") == "relu")


def _lower_relu(node: Node, graph: Graph, tensors: dict[str, QTensor], stats: Stats, cfg: NodeConfig) -> QLayer:
    tensors[node.outputs[0]] = tensors[node.inputs[0]]
    return QRelu(name=node.name, inputs=list(node.inputs), outputs=list(node.outputs))


LOWERINGS: dict[str, Callable[[Node, Graph, dict[str, QTensor], Stats, NodeConfig], QLayer]] = {
    "dense": _lower_dense,
    "relu": _lower_relu,
}


def quantize(graph: Graph, stats: Stats, config: QuantConfig) -> QGraph:
    """Lower a float graph with one input and one output to integer layers."""
    if len(graph.inputs) != 1 or len(graph.outputs) != 1:
        raise BuildError(f"integer lowering needs exactly one graph input and one output "
                         f"(got {len(graph.inputs)} and {len(graph.outputs)})")
    if not graph.nodes:
        raise BuildError("integer lowering: the graph has no nodes")
    for node in graph.nodes:
        if node.op not in LOWERINGS:
            raise BuildError(f"node {node.name!r}: op {node.op!r} has no integer lowering yet")
        if node.name not in config.nodes:
            raise BuildError(f"node {node.name!r}: the quantization config has no entry for it")

    spec = graph.inputs[0]
    first_consumer = next((n for n in graph.nodes if spec.name in n.inputs), None)
    if first_consumer is None or config.nodes[first_consumer.name].activation is None:
        raise BuildError(f"graph input {spec.name!r}: no consuming node with an activation choice")
    where = f"graph input {spec.name!r}"
    input_choice = config.nodes[first_consumer.name].activation
    tensors = {spec.name: QTensor(tuple(int(d) for d in spec.shape[1:]),
                                  activation_params(*_range(stats, spec.name, input_choice, where),
                                                    input_choice, where))}
    layers = [LOWERINGS[node.op](node, graph, tensors, stats, config.nodes[node.name]) for node in graph.nodes]
    return QGraph(spec.name, graph.outputs[0], tensors, layers)
