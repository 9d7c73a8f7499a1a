"""Given quantization (dabuild/ir/given_quant.py) as the integer path takes it: params, weights, configs.

A tensor read by a fake_quant node gets that node's parameters as its
QuantParams, and a constant recorded in `Graph.given` keeps its integers and
scales, instead of what calibration would pick. In a QuantConfig a given role
is a QuantChoice whose algorithm is GIVEN (its dtype and scheme say what was
given), so the tuning space holds exactly one choice there while the roles the
model left in float keep the capability's candidates.

What the integer path cannot represent is refused, naming the node, the
parameter and the nearest representable choice: widths outside
int2..int16/uint1..uint16, rounding other than to nearest, per-channel or
narrow-range activations, weights with a zero point, per-channel weights along
another axis than the output channels, blocked weights outside a dense
(blocked weights may have zero points: they are centred away).

Blocked weights (ONNX opset 21 `block_size`) of a dense (in, out) come as
`WeightBlocks`: scales per block of inputs and output channel. Blocks along
the output channels are per-channel scales in disguise when every input row
shares them (and so are blocks along the inputs that all share one scale per
channel): those become ordinary per-channel weights. What remains cannot be
folded into one scale per output, so it lowers to a `blocked_dense` layer
(`dabuild.qir.layers.blocked`); blocks along the output channels whose
scales change from row to row are blocks of one input there. A type that differs from what the
capability offers only in signedness is shifted exactly (uint8 with zero point
z is int8 with zero point z - 128), so onnxruntime's uint8 activations run on
int8-only kernels unchanged.

Fixed-point quantizers (`fixed_quant`, HGQ2's) lower to a `fixed_quant` layer
of their own, per element, from the exact tensor they read to the envelope of
their types (`fixed_params`: scale 2**-F, the narrowest type holding every
element's range). In a graph with such quantizers every tensor no quantizer
fixes is exact (algorithm EXACT): a dense or conv keeps its whole accumulator
(scale s_x * s_w, a type as wide as its worst case), relu, max pooling and the
layout ops keep their input's. A graph input read by a fixed quantizer is
quantized to floor and wrap-around on the grid 2**-F (half_up: 2**-(F + 1)),
from which the quantizer's own rounding gives what it gives on the float.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import numpy as np

from dabuild.errors import BuildError
from dabuild.ir.given_quant import FIXED_OP, OP, OPS, FixedQuant, GivenQuant
from dabuild.ir.graph import Graph, Node
from dabuild.qir.dtypes import MAX_BITS, MIN_BITS, fitting_type, int_type
from dabuild.qir.fixed_point import nearest_power_of_two
from dabuild.qir.qgraph import QuantParams
from dabuild.quant.config import QuantChoice, QuantConfig

GIVEN = "given"  # the `algorithm` of a QuantChoice taken from the model
EXACT = "exact"  # the `algorithm` of a tensor a fixed-point given model leaves unquantized: kept exact
EXACT_CHOICE = QuantChoice("int32", "pot", "per_tensor", EXACT)
NEAREST_ROUNDING = ("half_even", "half_away")  # to nearest; ties differ only on exact halves


def nearest_type(bits: int, signed: bool) -> str:
    """The dabuild type closest to a width dabuild does not lower."""
    clamped = min(max(bits, MIN_BITS[signed]), MAX_BITS)
    return f"{'' if signed else 'u'}int{clamped}"


def _is_power_of_two(values: tuple[float, ...]) -> bool:
    return all(np.frexp(s)[0] == 0.5 for s in values)


def scheme_of(given: GivenQuant) -> str:
    """pot (zero point 0, power-of-two scales), sym (zero point 0) or asym; blocked weights are symmetric once
    their zero points are centred away (`weight_blocks`)."""
    if any(given.zero_point) and not given.blocked:
        return "asym"
    return "pot" if _is_power_of_two(given.scale) else "sym"


def check_type(given: GivenQuant, where: str) -> None:
    """BuildError unless the width and rounding are ones the integer path runs."""
    if not MIN_BITS[given.signed] <= given.bits <= MAX_BITS:
        raise BuildError(f"{where}: parameter bit width: {given.dtype} is not a type dabuild lowers; nearest "
                         f"representable: {nearest_type(given.bits, given.signed)}")
    if given.rounding not in NEAREST_ROUNDING:
        raise BuildError(f"{where}: parameter rounding: {given.rounding!r} is implemented by no target (they round "
                         "to nearest); nearest representable: rounding 'half_away' (or 'half_even')")


def activation_params(given: GivenQuant, where: str, dtype: str | None = None) -> QuantParams:
    """The QuantParams of an activation quantized as `given`, in `dtype` when that differs only in signedness."""
    check_type(given, where)
    if given.per_channel:
        raise BuildError(f"{where}: parameter axis: activations are quantized per tensor in dabuild (per-channel "
                         f"along axis {given.axis}); nearest representable: one scale for the tensor")
    if given.narrow:
        raise BuildError(f"{where}: parameter narrow: dabuild's activations use the full range of {given.dtype}; "
                         "nearest representable: narrow false")
    scale, zero_point = float(given.scale[0]), int(given.zero_point[0])
    low, high = given.bounds()
    if not low <= zero_point <= high:
        raise BuildError(f"{where}: parameter zero_point: {zero_point} lies outside {given.dtype}'s range "
                         f"[{low}, {high}]; nearest representable: {int(np.clip(zero_point, low, high))}")
    if dtype is not None and dtype != given.dtype and int_type(dtype).bits == given.bits:
        zero_point += int_type(dtype).qmin - low  # the same integers moved into the other signedness
        return QuantParams(scale, zero_point, dtype)
    return QuantParams(scale, zero_point, given.dtype)


@dataclass(frozen=True)
class WeightBlocks:
    """A dense (in, out) weight whose scales change along the inputs: `scales` (blocks, out), one row per
    `block_size` inputs (the last block may be shorter)."""

    integers: np.ndarray
    scales: np.ndarray
    block_size: int


def _symmetric(given: GivenQuant, where: str) -> None:
    check_type(given, where)
    if any(given.zero_point):
        raise BuildError(f"{where}: parameter zero_point: the weight has zero point {max(given.zero_point, key=abs)}; "
                         "dabuild's kernels take symmetric weights; nearest representable: zero point 0")


def weight_blocks(weight: np.ndarray, given: GivenQuant, channel_axis: int, where: str,
                  ) -> WeightBlocks | tuple[np.ndarray, np.ndarray]:
    """A blocked given weight as WeightBlocks, or as (integers, one scale per output channel) where the blocks
    are per-channel scales in disguise (module doc). Zero points (onnxruntime's asymmetric MatMulNBits uint4)
    are taken off the integers here (signed, int8 storage where they fit), so such a weight always takes the
    blocked path, whose kernels read symmetric integers; negative scales (its symmetric form) flip their
    integers' signs. BuildError for a weight other than a dense's 2-D one."""
    check_type(given, where)
    channel_axis %= weight.ndim
    if weight.ndim != 2:
        raise BuildError(f"{where}: parameter block_size: blocked scales (blocks of {given.block_size} along axis "
                         f"{given.axis}) are lowered for a dense's 2-D weight only; nearest representable: one "
                         "scale per output channel (block_size 0)")
    per_element = given.broadcast(given.scale, weight.shape)
    centred = (given.integers(weight) - given.broadcast(given.zero_point, weight.shape)) * np.sign(per_element)
    integers = centred.astype(np.int8 if np.abs(centred).max(initial=0) <= 127 else np.int16)
    inputs = 1 - channel_axis
    if given.axis == inputs:
        block_size, scales = given.block_size, given.blocks(given.scale)
    else:  # blocks of output channels: one scale per input row and channel
        block_size, scales = 1, per_element
    scales = np.abs(np.asarray(scales if inputs == 0 else scales.T, dtype=np.float64))
    if not any(given.zero_point) and np.all(scales == scales[:1]):
        return integers, scales[0]
    return WeightBlocks(integers, scales, block_size)


def weight_integers(weight: np.ndarray, given: GivenQuant, channel_axis: int, where: str,
                    ) -> tuple[np.ndarray, np.ndarray]:
    """The given integer weights and their scales (shape (1,) or one per output channel), as quantize_weight;
    BuildError for blocked scales that are not per-channel ones (`weight_blocks` lowers those)."""
    if given.blocked:
        blocks = weight_blocks(weight, given, channel_axis, where)
        if isinstance(blocks, WeightBlocks):
            raise BuildError(f"{where}: parameter block_size: the weight's scales change along its inputs (blocks "
                             f"of {blocks.block_size}), which only a dense lowers; nearest representable: one scale "
                             "per output channel (block_size 0)")
        return blocks
    _symmetric(given, where)
    channel_axis %= weight.ndim
    if given.axis is not None and given.axis % weight.ndim != channel_axis:
        raise BuildError(f"{where}: parameter axis: the weight is quantized per slice of axis {given.axis}, "
                         f"dabuild quantizes weights per output channel; nearest representable: axis {channel_axis} "
                         "or one scale for the tensor")
    values = given.integers(weight)
    return values.astype(int_type(given.dtype).storage), np.asarray(given.scale, dtype=np.float64)


def fixed_params(quant: FixedQuant, where: str) -> QuantParams:
    """The tensor a fixed-point quantizer writes: scale 2**-F, the narrowest type holding every element."""
    low, high = quant.envelope()
    return QuantParams(2.0 ** -quant.fractional_bits, 0, fitting_type(low, high, where))


def fixed_input_params(quant: FixedQuant, where: str) -> QuantParams:
    """The params of a graph input a fixed-point quantizer reads (module doc): floor and wrap on 2**-F, or on
    2**-(F + 1) for half_up, where the quantizer's own rounding of the floor is its rounding of the float."""
    extra = {"floor": 0, "half_up": 1}.get(quant.rounding)
    if extra is None and len(set(quant.f)) > 1:
        raise BuildError(f"{where}: parameter rounding: {quant.rounding!r} with a fractional width per element over "
                         "the graph input cannot be applied to integers dabuild quantizes once; nearest "
                         "representable: rounding 'half_up' (HGQ2's RND) or 'floor' (TRN)")
    low, high = quant.envelope()
    scale = 2.0 ** -(quant.fractional_bits + (extra or 0))
    wide = 2 ** (extra or 0)
    return QuantParams(scale, 0, fitting_type(low * wide, high * wide + wide - 1, where),
                       "floor" if extra is not None else quant.rounding,
                       "wrap" if quant.overflow == "wrap" else "saturate")


def fixed_point_model(graph: Graph) -> bool:
    """Whether the model states fixed-point quantizers (HGQ2's), so the tensors between them are exact."""
    return any(node.op == FIXED_OP for node in graph.nodes)


def quantizers(graph: Graph) -> dict[str, Node]:
    """Activation tensor -> the fake_quant node reading it (the first, where several do)."""
    found: dict[str, Node] = {}
    for node in graph.nodes:
        if node.op == OP and node.inputs[0] not in graph.constants:
            found.setdefault(node.inputs[0], node)
    return found


def given_tensor_params(graph: Graph, config: QuantConfig) -> dict[str, QuantParams]:
    """Tensor -> the params the model fixes: each fake_quant's output, and the tensor it reads where it is the
    first fake_quant to read it (in the dtype the node's config shifts it to)."""
    first = quantizers(graph)
    params: dict[str, QuantParams] = {}
    inputs = {spec.name for spec in graph.inputs}
    for node in graph.nodes:
        if node.op == FIXED_OP:
            where = f"node {node.name!r} ({FIXED_OP})"
            quant = FixedQuant.from_attrs(node.attrs)
            params[node.outputs[0]] = fixed_params(quant, where)
            if node.inputs[0] in inputs:
                params.setdefault(node.inputs[0], fixed_input_params(quant, where))
            continue
        if node.op != OP or node.inputs[0] in graph.constants:
            continue
        activation = config.nodes[node.name].activation
        value = activation_params(GivenQuant.from_attrs(node.attrs), f"node {node.name!r} (fake_quant)",
                                  activation.dtype if activation else None)
        params[node.outputs[0]] = value
        if first.get(node.inputs[0]) is node:
            params.setdefault(node.inputs[0], value)
    return params


def carries_quantization(graph: Graph) -> bool:
    """Whether the model came with quantization of its own (the `given` strategy is then the default)."""
    return bool(graph.given) or any(node.op in OPS for node in graph.nodes)


def check_scheme(choice: QuantChoice, given: GivenQuant | FixedQuant | None, schemes: Collection[str], where: str,
                 capability: str) -> None:
    """BuildError unless a backend offering `schemes` represents the given quantization exactly: pot is sym with
    power-of-two scales, sym is asym with zero point 0."""
    accepted = {"pot": ("pot", "sym", "asym"), "sym": ("sym", "asym"), "asym": ("asym",)}[choice.scheme]
    if any(scheme in schemes for scheme in accepted):
        return
    if not isinstance(given, GivenQuant):  # fixed point (pot by construction) or exact
        raise BuildError(f"{where}: the model's fixed-point quantization has power-of-two scales, which capability "
                         f"{capability!r} does not offer (it offers {', '.join(schemes)}); nearest representable: "
                         "a capability with scheme pot (da4ml)")
    if "pot" in schemes and choice.scheme != "pot" and not _is_power_of_two(given.scale):
        worst = next(s for s in given.scale if np.frexp(s)[0] != 0.5)
        raise BuildError(f"{where}: parameter scale: {worst:g} is not a power of two, which capability "
                         f"{capability!r} needs (scheme pot); nearest representable: {nearest_power_of_two(worst)}")
    raise BuildError(f"{where}: parameter zero_point: {max(given.zero_point, key=abs)} makes the quantization "
                     f"{choice.scheme}, capability {capability!r} offers only {', '.join(schemes)}; nearest "
                     "representable: zero point 0")


def given_choices(graph: Graph, offered: dict[str, tuple[Collection[str], Collection[str]]] | None = None,
                  ) -> dict[str, dict[str, tuple[QuantChoice, GivenQuant | FixedQuant | None]]]:
    """Node name -> role -> the QuantChoice the model fixes and what it was given (roles left in float are absent).

    `offered` maps a node to the activation dtypes and schemes its capability entry
    lists: a given type absent there but present in the other signedness is
    shifted to it where the entry takes a zero point (asym).
    """
    reads = quantizers(graph)
    exact = fixed_point_model(graph)
    choices: dict[str, dict[str, tuple[QuantChoice, GivenQuant | FixedQuant | None]]] = {}
    for node in graph.nodes:
        roles: dict[str, tuple[QuantChoice, GivenQuant | FixedQuant | None]] = {}
        weight = node.inputs[1] if len(node.inputs) > 1 else None
        if weight in graph.given and node.op in ("dense", "conv"):
            given = graph.given[weight]
            granularity = "per_block" if given.blocked else "per_channel" if given.per_channel else "per_tensor"
            roles["weight"] = (QuantChoice(given.dtype, scheme_of(given), granularity, GIVEN), given)
        quantizer = node if node.op == OP else reads.get(node.outputs[0])
        if node.op == FIXED_OP:
            fixed = FixedQuant.from_attrs(node.attrs)
            params = fixed_params(fixed, f"node {node.name!r} ({FIXED_OP})")
            roles["activation"] = (QuantChoice(params.dtype, "pot", "per_tensor", GIVEN), fixed)
        elif quantizer is not None:
            given = GivenQuant.from_attrs(quantizer.attrs)
            dtype = given.dtype
            other = f"{'u' if given.signed else ''}int{given.bits}"
            types, schemes = (offered or {}).get(node.name, ((), ()))
            if dtype not in types and other in types and "asym" in schemes:
                dtype = other
            scheme = "asym" if dtype != given.dtype else scheme_of(given)
            roles["activation"] = (QuantChoice(dtype, scheme, "per_tensor", GIVEN), given)
        elif exact and node.op != OP:
            roles["activation"] = (EXACT_CHOICE, None)
        if roles:
            choices[node.name] = roles
    return choices
