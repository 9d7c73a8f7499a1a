"""The lowering registry and what every op's lowering shares.

A lowering turns one float node into integer layers. It is a function
registered with `@lowers("op", ...)` in the module of its layer kind
(`dabuild.quant.lowerings.<kind>`, beside the layer classes of
`dabuild.qir.layers.<kind>` it emits). Each gets a
`Lowering` context: the float graph, the calibration statistics, the node's
config, and the tensors lowered so far, with helpers for the recurring
steps (output params from a calibrated range, constants, shapes).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dabuild.errors import BuildError
from dabuild.ir.graph import Graph, Node, TensorSpec
from dabuild.qir.activations import is_table_activation, pre_activation
from dabuild.qir.dtypes import NAMES_TEXT, int_type, is_int_type
from dabuild.qir.fixed_point import quantize_multiplier, round_half_away
from dabuild.qir.qgraph import LAYER_TYPES, QLayer, QTensor, QuantParams
from dabuild.quant.algorithms import ALGORITHMS
from dabuild.quant.calibrate import Stats
from dabuild.quant.config import NodeConfig, QuantChoice
from dabuild.quant.given_params import EXACT, GIVEN, WeightBlocks, weight_blocks, weight_integers
from dabuild.quant.lowerings import MODULES as LOWERING_MODULES
from dabuild.registry import Registry

# A range the fp32 fallback and graph inputs without a quantized consumer use.
MINMAX_INT8 = QuantChoice("int8", "asym", "per_tensor", "minmax")
# Scheme "pot": symmetric with every scale a power of two, so a tensor is a fixed-point number
# (integer q, fractional bits -log2(scale)) and every requantization is a pure shift, the form
# fixed-point hardware (the hdl target) takes. Its ranges are calibrated as for "sym".
POWER_OF_TWO = "pot"


def range_scheme(scheme: str) -> str:
    """The scheme calibration derives a range for (pot scales cover a symmetric range)."""
    return "sym" if scheme == POWER_OF_TWO else scheme


def power_of_two_at_least(values: np.ndarray | float) -> np.ndarray:
    """The smallest powers of two >= positive `values` (a scale rounded up never clips)."""
    return 2.0 ** np.ceil(np.log2(np.asarray(values, dtype=np.float64)))


def require(choice: QuantChoice, where: str, *, scheme: tuple[str, ...], granularity: tuple[str, ...]) -> None:
    """Fail clearly on a choice the integer lowering cannot honour yet."""
    problems = []
    if not is_int_type(choice.dtype):
        problems.append(f"dtype {choice.dtype!r} (integer dtypes: {NAMES_TEXT})")
    if choice.scheme not in scheme:
        problems.append(f"scheme {choice.scheme!r}")
    if choice.granularity not in granularity:
        problems.append(f"granularity {choice.granularity!r}")
    if choice.algorithm not in ALGORITHMS:
        problems.append(f"calibration algorithm {choice.algorithm!r}")
    if problems:
        raise BuildError(f"{where}: integer lowering does not support {', '.join(problems)} yet")


def activation_params(low: float, high: float, choice: QuantChoice, where: str) -> QuantParams:
    """Scale and zero point covering [low, high] and always 0 (so zero padding and relu are exact).

    sym and pot have zero point 0, so an unsigned dtype holds [0, high] and clips negatives; asym places
    the zero point inside any dtype's range."""
    require(choice, where, scheme=("asym", "sym", POWER_OF_TWO), granularity=("per_tensor",))
    dtype = int_type(choice.dtype)
    qmin, qmax = dtype.qmin, dtype.qmax
    low, high = min(low, 0.0), max(high, 0.0)
    if choice.scheme in ("sym", POWER_OF_TWO):
        scale = max(-low, high) / qmax
        if scale > 0 and choice.scheme == POWER_OF_TWO:
            scale = float(power_of_two_at_least(scale))
        return QuantParams(scale if scale > 0 else 1.0, 0, choice.dtype)
    scale = (high - low) / (qmax - qmin)
    if scale == 0:
        return QuantParams(1.0, 0, choice.dtype)
    zero_point = int(np.clip(qmin - round_half_away(np.float64(low / scale)), qmin, qmax))
    return QuantParams(float(scale), zero_point, choice.dtype)


def weight_peaks(weight: np.ndarray, choice: QuantChoice, channel_axis: int) -> np.ndarray:
    """The clipping magnitude of weights: shape (1,) per tensor, one per slice of `channel_axis` per channel.

    minmax takes the exact largest magnitude; other algorithms read a histogram of the weight.
    """
    per_tensor = choice.granularity == "per_tensor"
    if choice.algorithm == "minmax":
        others = tuple(a for a in range(weight.ndim) if a != channel_axis)
        return np.atleast_1d(np.max(np.abs(weight.astype(np.float64)), axis=None if per_tensor else others))
    stats = Stats()
    stats.observe("weight", weight, axis=channel_axis)
    if per_tensor:
        return np.array([stats.range("weight", choice.algorithm, "sym", choice.dtype)[1]])
    return stats.channel_ranges("weight", choice.algorithm, "sym", choice.dtype)[1]


def quantize_weight(weight: np.ndarray, choice: QuantChoice, where: str,
                    channel_axis: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int weights and their scales: shape (1,) per tensor, one per output channel per channel.

    The values lie in [-qmax, qmax] of the choice's dtype (int8: +-127, int4: +-7; unsigned: [0, qmax],
    negative weights clip to 0), stored in its storage type (int8 up to 8 bits), so the integer
    kernels need nothing new for narrower weights.
    """
    require(choice, where, scheme=("sym", POWER_OF_TWO), granularity=("per_tensor", "per_channel"))
    dtype = int_type(choice.dtype)
    qmax = dtype.qmax
    channel_axis %= weight.ndim
    peak = weight_peaks(weight, choice, channel_axis)
    scales = np.where(peak > 0, peak / qmax, 1.0)
    if choice.scheme == POWER_OF_TWO:
        scales = power_of_two_at_least(scales)
    shape = [1] * weight.ndim
    shape[channel_axis] = -1
    q = np.clip(round_half_away(weight / scales.reshape(shape)), max(dtype.qmin, -qmax), qmax).astype(dtype.storage)
    return q, scales


class WeightCache:
    """The integer weights each node was last lowered with, by choice, and what the kernels derived from them.

    A tuning run lowers hundreds of configs that differ from one another in a node or two; quantizing and
    packing ResNet-50's 25 M weights again for each was a tenth of a trial. A node's entry is reused while
    its weight choice stays, and replaced when it changes, so the cache holds one lowered graph's weights
    (which the last trial's graph held anyway). Cached arrays are read-only: a layer never writes its weight.
    """

    def __init__(self) -> None:
        self._entries: dict[str, tuple[tuple[object, ...], np.ndarray, np.ndarray, dict[int | str, object]]] = {}

    def weights(self, node: str, key: tuple[object, ...],
                compute: Callable[[], tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
        """Node `node`'s integer weights and scales for `key` (everything they depend on), computed once."""
        entry = self._entries.get(node)
        if entry is None or entry[0] != key:
            weight, scale = compute()
            weight.flags.writeable = scale.flags.writeable = False
            entry = self._entries[node] = (key, weight, scale, {})
        return entry[1], entry[2]

    def derived(self, node: str) -> dict[int | str, object]:
        """A dict that lives as long as node `node`'s cached weights: where its layers keep what they derive
        from them (qconv.c's packed weights and their range, the sums of |w| lowering bounds the accumulator
        with)."""
        return self._entries[node][3] if node in self._entries else {}


@dataclass(frozen=True)
class FusedActivation:
    """A dense/conv node's fused activation: its op and attrs, and the tensor the weighted layer writes (the
    node's output, or for a table activation the pre-activation the lookup layer reads)."""

    op: str
    attrs: dict[str, Any]
    written: str

    @property
    def table(self) -> bool:
        return is_table_activation(self.op)

    @classmethod
    def of(cls, node: Node) -> FusedActivation:
        op = node.attrs.get("activation", "none")
        return cls(op, dict(node.attrs.get("activation_attrs", {})),
                   pre_activation(node.outputs[0]) if is_table_activation(op) else node.outputs[0])


@dataclass
class Lowering:
    """What a lowering reads (graph, stats, node, config) and the tensors it adds to."""

    graph: Graph
    stats: Stats
    shapes: dict[str, TensorSpec]
    tensors: dict[str, QTensor]
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    node: Node = field(default=None)  # type: ignore[assignment]  # the node being lowered (None: the graph input)
    config: NodeConfig = field(default=None)  # type: ignore[assignment]
    bias_correction: bool = False  # correct weighted layers' biases for their mean weight error (bias_correction)
    given: dict[str, QuantParams] = field(default_factory=dict)  # tensors whose params the model fixes (quant/given_params.py)
    renames: dict[str, str] = field(default_factory=dict)  # tensor -> the name it goes by once lowered (fake_quant)
    island: set[str] = field(default_factory=set)  # tensors that stay float32 (layers.fallback.island_tensors)
    floats: dict[str, tuple[int, ...]] = field(default_factory=dict)  # those lowered so far: per-sample shapes
    weight_cache: WeightCache | None = None  # integer weights kept from the configs lowered before (tuning)

    @property
    def activation(self) -> QuantChoice:
        """The node's activation choice, which an integer lowering needs (fp32 nodes lower elsewhere)."""
        if self.config.activation is None:
            raise BuildError(f"{self.where}: no activation quantization is chosen, which integer lowering needs")
        return self.config.activation

    @property
    def where(self) -> str:
        if self.node is None:
            return f"graph input {self.graph.inputs[0].name!r}"
        return f"node {self.node.name!r} ({self.node.op})"

    def sample_shape(self, tensor: str) -> tuple[int, ...]:
        """A tensor's shape without its batch axis; every other axis must be known."""
        shape = self.shapes[tensor].shape[1:]
        known = [d for d in shape if d is not None]
        if len(known) < len(shape):
            raise BuildError(f"{self.where}: tensor {tensor!r} has dynamic axes {list(shape)} besides the batch")
        return tuple(int(d) for d in known)

    def rank(self, tensor: str) -> int:
        """Rank with the batch axis, as the float op sees it."""
        return len(self.shapes[tensor].shape)

    def params(self, tensor: str) -> QuantParams:
        """The params of an already lowered (activation or integer constant) tensor."""
        if tensor not in self.tensors:
            raise BuildError(f"{self.where}: input {tensor!r} is a constant where integer lowering needs an "
                             "activation; fold constants first (dabuild.ir.passes.optimize) or run it in fp32")
        return self.tensors[tensor].params

    def is_constant(self, tensor: str) -> bool:
        return tensor in self.graph.constants

    def constant(self, tensor: str) -> np.ndarray:
        if tensor not in self.graph.constants:
            raise BuildError(f"{self.where}: input {tensor!r} must be a constant for integer lowering")
        return np.asarray(self.graph.constants[tensor])

    def calibrated(self, tensor: str, choice: QuantChoice | None = None) -> QuantParams:
        """Params of `tensor` from the range the choice's calibration algorithm derives (default: the node's);
        the model's own where it gives them."""
        if tensor in self.given:
            return self.given[tensor]
        choice = choice or self.activation
        if choice.algorithm == EXACT:
            raise BuildError(f"{self.where}: the model's fixed-point quantizers (HGQ2's) leave tensor {tensor!r} "
                             "exact, which dabuild keeps only at the output of dense, conv, relu, max pooling and "
                             "layout ops; quantize it in the model (an output quantizer on this layer)")
        if choice.algorithm == GIVEN:  # a tensor of a given node the model did not quantize (a fused table's input)
            choice = QuantChoice(choice.dtype, choice.scheme, choice.granularity, "minmax")
        if tensor not in self.stats.ranges:
            raise BuildError(f"{self.where}: no calibration range for tensor {tensor!r}; recalibrate with this graph")
        require(choice, self.where, scheme=("asym", "sym", POWER_OF_TWO), granularity=("per_tensor",))
        low, high = self.stats.range(tensor, choice.algorithm, range_scheme(choice.scheme), choice.dtype)
        return activation_params(low, high, choice, self.where)

    def weight_integers(self, weight: np.ndarray, choice: QuantChoice, channel_axis: int,
                        ) -> tuple[np.ndarray, np.ndarray]:
        """The node's integer weights and scales: the model's own where it gives them (Graph.given), else as
        `choice` quantizes them."""
        given = self.graph.given.get(self.node.inputs[1]) if self.node.op in ("dense", "conv") else None
        if self.node.op == "conv_transpose" and self.node.attrs.get("groups", 1) == 1:
            # the graph's (C, O, *kernel) weight arrives in conv layout (O, C, *kernel): its per-channel axis swaps
            given = self.graph.given.get(self.node.inputs[1])
            if given is not None and given.axis is not None and given.axis % weight.ndim in (0, 1):
                given = dataclasses.replace(given, axis=1 - given.axis % weight.ndim)

        def compute() -> tuple[np.ndarray, np.ndarray]:
            if given is not None:
                return weight_integers(weight, given, channel_axis, self.where)
            return quantize_weight(weight, choice, self.where, channel_axis)

        if self.weight_cache is None:
            return compute()
        return self.weight_cache.weights(self.node.name, (choice, channel_axis, given is not None), compute)

    def weight_magnitudes(self, weight_q: np.ndarray, others: tuple[int, ...]) -> np.ndarray:
        """sum |w| over the axes `others` of the node's integer weights `weight_q` (int64): once per cached weight,
        as a tuning run lowers the same weights under hundreds of configs."""
        def compute() -> np.ndarray:
            return np.abs(weight_q.astype(np.int64)).sum(axis=others)

        if self.weight_cache is None:
            return compute()
        derived = self.weight_cache.derived(self.node.name)
        key = f"magnitudes{others}"
        if key not in derived:
            derived[key] = compute()
        return derived[key]  # type: ignore[return-value]

    def weight_blocks(self, weight: np.ndarray, channel_axis: int) -> WeightBlocks | None:
        """The node's given weight as blocks where its scales change along the inputs (a dense's blocked
        weights, `dabuild.quant.given_params.weight_blocks`), else None."""
        given = self.graph.given.get(self.node.inputs[1])
        if given is None or not given.blocked:
            return None
        blocks = weight_blocks(weight, given, channel_axis, self.where)
        return blocks if isinstance(blocks, WeightBlocks) else None

    def output(self, tensor: str, params: QuantParams, like: str | None = None) -> None:
        """Declare a lowered output tensor (shaped like the float tensor `like`, by default itself)."""
        self.tensors[tensor] = QTensor(self.sample_shape(like or tensor), params)

    def int8_input(self, tensor: str) -> str:
        """The name a layer reads `tensor` by: itself, or for a constant an integer copy quantized with its
        own exact min/max (under the node's activation dtype and scheme), owned by this node."""
        if not self.is_constant(tensor):
            return tensor
        values = self.constant(tensor).astype(np.float32)
        choice = self.activation
        low, high = float(values.min(initial=0.0)), float(values.max(initial=0.0))
        if choice.scheme in ("sym", POWER_OF_TWO):
            low, high = -max(-low, high), max(-low, high)
        params = activation_params(low, high, QuantChoice(choice.dtype, choice.scheme, "per_tensor", "minmax"),
                                   self.where)
        name = f"{self.node.name}:{tensor}"
        self.constants[name] = params.quantize(values)
        self.tensors[name] = QTensor(tuple(values.shape), params)
        return name

    def product_of_inputs(self) -> tuple[list[str], np.ndarray, np.ndarray]:
        """For a layer whose output is the product of its two inputs (mul, matmul): the names it reads them by,
        and the multiplier and shift that take s_a * s_b to the output's calibrated scale (output recorded)."""
        inputs = [self.int8_input(name) for name in self.node.inputs]
        target = self.calibrated(self.node.outputs[0])
        self.output(self.node.outputs[0], target)
        real = self.params(inputs[0]).scale * self.params(inputs[1]).scale / target.scale
        multiplier, shift = quantize_multiplier(real, self.where)
        return inputs, multiplier, shift


LowerFunction = Callable[[Lowering], list[QLayer]]


@dataclass(frozen=True)
class Lowerer:
    """An op's lowering and the roles its config quantizes (a weight, an output activation)."""

    lower: LowerFunction
    roles: tuple[str, ...]
    layers: tuple[str, ...] | None = None  # the QLayer types it may make (docs/ops.md's coverage); None = undeclared

    def __call__(self, ctx: Lowering) -> list[QLayer]:
        """The node's layers, held to the declared layer types (the coverage table relies on them)."""
        made = self.lower(ctx)
        undeclared = sorted({layer.op for layer in made} - set(self.layers or ())) if self.layers is not None else []
        if undeclared:
            raise BuildError(f"node {ctx.node.name!r}: the {ctx.node.op} lowering makes {', '.join(undeclared)} "
                             f"layers, which it does not declare ({', '.join(self.layers or ()) or 'none'})")
        return made


LOWERINGS: Registry[Lowerer] = Registry("integer lowering", "dabuild's quantizer", LOWERING_MODULES)

# Ops integer lowering refuses by design, with the reason: they have no exact integer form in dabuild and
# run in float (a float island, on targets whose capability allows float). docs/ops.md lists them.
FLOAT_ONLY: dict[str, str] = {
    "layer_norm": "it divides by a standard deviation computed from each sample",
    "instance_norm": "it divides by a standard deviation computed from each sample",
    "group_norm": "it divides by a standard deviation computed from each sample",
    "lrn": "it divides by a power of a window sum of squares",
    "log_softmax": "it takes the log of a sum of exponentials",
}


def float_only_message(node: str, op: str) -> str:
    """Why node `node` of float-only op `op` cannot be quantized, and what to do."""
    return (f"node {node!r}: op {op!r} must run in float ({FLOAT_ONLY[op]}): keep it in fp32 (a float island) "
            "on a target whose capability allows float")


def lowers(*ops: str, weighted: bool = False,
           layers: tuple[str, ...] | Mapping[str, tuple[str, ...]] | None = None,
           ) -> Callable[[LowerFunction], LowerFunction]:
    """Register a function as the integer lowering of the float ops `ops`; `weighted` ops (input 1 a
    constant weight) quantize a weight as well as their output. `layers` names the QLayer types it makes
    (for all ops, or per op): the targets' columns of the coverage table follow from it."""
    roles = ("weight", "activation") if weighted else ("activation",)

    def register(function: LowerFunction) -> LowerFunction:
        for op in ops:
            made = layers.get(op, ()) if isinstance(layers, Mapping) else layers
            LOWERINGS.add(op, Lowerer(function, roles, None if made is None else tuple(made)))
        return function
    return register


def integer_layers(lowerer: Lowerer) -> set[str]:
    """The integer layer types a lowering makes: those it declares, less the ones that compute in float (they
    exist only beside float islands, which integer-only targets never get)."""
    return {name for name in lowerer.layers or ()
            if not getattr(LAYER_TYPES.get(name), "computes_in_float", False)}


def integer_forms() -> dict[str, frozenset[str]]:
    """Op -> the integer layer types its lowering makes (`integer_layers`), for every op that has one: what a
    target's `refuse` holds against the layer types it writes, handed over so targets need not import this."""
    return {op: frozenset(integer_layers(lowerer)) for op, lowerer in LOWERINGS.items()}


def quantizable_roles(op: str) -> tuple[str, ...] | None:
    """The roles a config quantizes for `op`, or None when it has no integer lowering."""
    lowerer = LOWERINGS.get(op)
    return lowerer.roles if lowerer else None
