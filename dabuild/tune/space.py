"""The tuning space: per node, every quantization config the capability allows, narrowed by the recipe.

A node's candidates are the cartesian product of its capability entry's
weight and activation choices (dtype x scheme x granularity x algorithm per
role), in the capability's order, so the first candidate is the default
choice; plus fp32 (`NodeConfig(None, None)`: the node runs in float) when the
capability allows fallback. This is what Intel Neural Compressor's
`query_fw_capability` returns, op-wise and op-type-wise.

Activation dtypes wider than 8 bits (int16) a capability lists are on request:
the space holds them only where `tuning.space` lists them.

`tuning.space` in the recipe narrows it like INC's `op_type_dict` and
`op_name_dict`: per op type or per node name, per role, a list per field;
op_name wins over op_type field by field. A narrowing the capability cannot
honour is an error naming it, never a silent no-op. Listing `fp32` among a
role's dtypes keeps fallback; narrowing dtypes without it removes fallback.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import math
from collections.abc import Collection, Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from dabuild.capability import CapabilitySpec, QuantChoices
from dabuild.errors import BuildError
from dabuild.ir.given_quant import OPS as GIVEN_OPS
from dabuild.ir.graph import Graph
from dabuild.ir.ops import OPS
from dabuild.qir.dtypes import NAMES_TEXT, int_type, is_int_type
from dabuild.quant.calibrate import LAST_AXIS_OPS
from dabuild.quant.config import NodeConfig, QuantChoice, QuantConfig
from dabuild.quant.given_params import check_scheme, given_choices
from dabuild.quant.lowering import quantizable_roles
from dabuild.quant.lowerings.fallback import FLOAT_WRITING_OPS

FP32 = NodeConfig(weight=None, activation=None)
# Activation dtypes wider than this many bits (int16, TFLite's 16x8) enter the space only where tuning.space asks
# for them by op type or node name: offered by default, they would double every node's activation choices, and so
# the trials of every search whose int8 configs already meet the goal.
WIDE_BITS = 8
FLOAT_DTYPE = "fp32"
FIELDS = ("dtype", "scheme", "granularity", "algorithm")
OBJECTIVES = ("size", "bops")

Narrowing = Mapping[str, Mapping[str, Mapping[str, list[str]]]]  # op type or node name -> role -> field -> values


def dtype_bits(dtype: str | None) -> int:
    """Bits of one value: int8 -> 8, uint5 -> 5 (dtypes.int_type; BuildError if unknown); None (float) -> 32."""
    return 32 if dtype is None else int_type(dtype).bits


@dataclass(frozen=True)
class NodeSpace:
    """One node's candidates and what its cost depends on."""

    name: str
    op: str
    candidates: tuple[NodeConfig, ...]  # the first is the default
    weight_size: int  # elements of the node's constant weight (0: no weight)
    macs: int  # multiply-accumulates per sample through the weight (0: no weight)
    source: str | None  # the node whose activation quantizes this node's input (None: unknown, counted as float)
    activation_size: int = 0  # elements per sample of the node's output (what its activation quantizes)

    @property
    def default(self) -> NodeConfig:
        return self.candidates[0]

    def weight_bits(self, choice: NodeConfig) -> int:
        return self.weight_size * dtype_bits(choice.weight.dtype if choice.weight else None)

    def wide_activation_bits(self, choice: NodeConfig) -> int:
        """The RAM bits an integer activation wider than 8 bits adds to its output over int8 (int16: 8 a value)."""
        if choice.activation is None:
            return 0
        return self.activation_size * max(0, dtype_bits(choice.activation.dtype) - 8)


@dataclass
class TuningSpace:
    """Every node's candidates, in graph order, with the costs the objective compares."""

    nodes: dict[str, NodeSpace]

    def default(self) -> QuantConfig:
        return QuantConfig({name: node.default for name, node in self.nodes.items()})

    def fp32(self) -> QuantConfig:
        """Every node in float: the reference point of the size and BOPs ratios."""
        return QuantConfig({name: FP32 for name in self.nodes})

    def size(self, config: QuantConfig) -> int:
        """Total bits of the weights stored under `config`, plus the RAM its activations wider than 8 bits add
        (`wide_activation_bits`): int16 activations cost their extra byte a value, so the search takes them only
        on the layers whose accuracy needs them (mixed 8/16)."""
        return (sum(node.weight_bits(config.nodes[name]) for name, node in self.nodes.items())
                + self.wide_activation_bits(config))

    def wide_activation_bits(self, config: QuantConfig) -> int:
        """Bits of activation RAM per sample beyond int8 storage that `config`'s wider activations take."""
        return sum(node.wide_activation_bits(config.nodes[name]) for name, node in self.nodes.items())

    def bops(self, config: QuantConfig) -> int:
        """Bit operations per sample: multiply-accumulates x weight bits x input activation bits."""
        total = 0
        for name, node in self.nodes.items():
            choice = config.nodes[name]
            if node.macs == 0:
                continue
            if choice.weight is None:
                total += node.macs * 32 * 32
                continue
            source = config.nodes[node.source].activation if node.source else None
            total += node.macs * dtype_bits(choice.weight.dtype) * dtype_bits(source.dtype if source else None)
        return total

    def cost(self, config: QuantConfig, objective: str) -> int:
        if objective not in OBJECTIVES:
            raise BuildError(f"unknown tuning objective {objective!r} (known: {', '.join(OBJECTIVES)})")
        return self.size(config) if objective == "size" else self.bops(config)

    def floor(self, objective: str) -> int:
        """A lower bound of the cost over the whole space: reaching it means nothing cheaper exists."""
        if objective == "size":
            return sum(min(node.weight_bits(c) for c in node.candidates) for node in self.nodes.values())
        activation_bits = min((dtype_bits(c.activation.dtype if c.activation else None)
                               for node in self.nodes.values() for c in node.candidates), default=32)
        return sum(node.macs * min(dtype_bits(c.weight.dtype if c.weight else None) for c in node.candidates)
                   * activation_bits for node in self.nodes.values())

    def total(self) -> int:
        """How many configs the space holds."""
        return math.prod(len(node.candidates) for node in self.nodes.values())

    def with_node(self, config: QuantConfig, name: str, choice: NodeConfig) -> QuantConfig:
        return QuantConfig({**config.nodes, name: choice})

    def op_types(self) -> list[str]:
        """The graph's op types, in the order their first node appears."""
        return list(dict.fromkeys(node.op for node in self.nodes.values()))

    def field_moves(self, config: QuantConfig, op: str) -> list[QuantConfig]:
        """`config` with one field of one role (weight first, fields in FIELDS order) set to another value on every
        node of op type `op` whose candidates offer it: INC's op-type-wise alternatives, one field at a time."""
        members = [node for node in self.nodes.values() if node.op == op]
        moves: list[QuantConfig] = []
        for role in ("weight", "activation"):
            for field in FIELDS:
                values = dict.fromkeys(getattr(getattr(c, role), field) for node in members for c in node.candidates
                                       if getattr(c, role) is not None)
                for value in values:
                    nodes = dict(config.nodes)
                    for node in members:
                        current = getattr(nodes[node.name], role)
                        if current is None:
                            continue
                        moved = dataclasses.replace(nodes[node.name],
                                                    **{role: dataclasses.replace(current, **{field: value})})
                        if moved in node.candidates:
                            nodes[node.name] = moved
                    if nodes != config.nodes:
                        moves.append(QuantConfig(nodes))
        return moves

    def all_configs(self) -> Iterator[QuantConfig]:
        names = list(self.nodes)
        for picks in itertools.product(*(self.nodes[name].candidates for name in names)):
            yield QuantConfig(dict(zip(names, picks)))

    def capability_view(self) -> dict[str, Any]:
        """INC's `query_fw_capability` shape: op-wise (node name, op type) and op-type-wise candidate lists."""
        opwise = {(node.name, node.op): [_describe(c) for c in node.candidates] for node in self.nodes.values()}
        optypewise: dict[str, list[dict[str, Any]]] = {}
        for (_, op), candidates in opwise.items():
            merged = optypewise.setdefault(op, [])
            merged += [c for c in candidates if c not in merged]
        return {"opwise": opwise, "optypewise": optypewise}


def _describe(choice: NodeConfig) -> dict[str, Any]:
    return {role: (asdict(value) if value else {"dtype": FLOAT_DTYPE})
            for role, value in (("weight", choice.weight), ("activation", choice.activation))}


def integer_writers(graph: Graph, capability: CapabilitySpec) -> frozenset[str]:
    """The dense/convs that must requantize even where an island reads them: a quantized one hands an island its
    float sums through its fused activation, in float, so that activation needs a float kernel as an island does
    (`island_tensors`; the c target has no float hard_swish)."""
    return frozenset(node.name for node in graph.nodes if node.op in FLOAT_WRITING_OPS
                     and not capability.runs_float(node.op, node.attrs.get("activation")))


def build_space(graph: Graph, capability: CapabilitySpec, narrowing: Mapping[str, Narrowing] | None = None) -> TuningSpace:
    """Graph x capability (x the recipe's `tuning.space`) -> every node's candidates.

    Raises BuildError naming the recipe key, the node or op type and the
    capability when a narrowing cannot be honoured.
    """
    narrowing = narrowing or {}
    by_type, by_name = dict(narrowing.get("op_type") or {}), dict(narrowing.get("op_name") or {})
    _check_names(graph, by_type, by_name)
    shapes = graph.tensor_shapes()
    producers = graph.producers()
    input_consumers = {spec.name: next((n.name for n in graph.nodes if spec.name in n.inputs), None)
                       for spec in graph.inputs}
    offered: dict[str, tuple[Collection[str], Collection[str]]] = {
        node.name: (entry.dtype, entry.scheme) for node in graph.nodes
               if (entry := capability.for_op(node.op).activation) is not None}
    given = given_choices(graph, offered)
    readers = {node.name: [reader.op for reader in graph.nodes if set(reader.inputs) & set(node.outputs)]
               for node in graph.nodes}
    _check_given_narrowing(graph, given, by_type, by_name)
    nodes: dict[str, NodeSpace] = {}
    for node in graph.nodes:
        fixed = _given_roles(node.name, node.op, capability, given.get(node.name, {}))
        if node.op in GIVEN_OPS:  # the model's own quantizer: nothing to choose
            candidates: tuple[NodeConfig, ...] = (NodeConfig(None, fixed["activation"]),)
        else:
            own = _candidates(node.name, node.op, capability, by_type.get(node.op, {}), by_name.get(node.name, {}),
                              node.attrs.get("activation"))
            candidates = _with_given(_read_by_its_consumers(node.name, own, readers.get(node.name, []), capability),
                                     fixed)
        weight = graph.constants.get(node.inputs[1]) if len(node.inputs) > 1 else None
        if "weight" not in (quantizable_roles(node.op) or ()):
            weight = None
        macs = 0
        if weight is not None and not OPS[node.op].reads_indices:  # a table lookup multiplies nothing
            out = shapes[node.outputs[0]].shape
            per_sample = math.prod(int(d or 1) for d in out[1:])
            channels = out[-1] if node.op in LAST_AXIS_OPS else out[1]
            macs = int(weight.size) * (per_sample // int(channels or 1))
        first = node.inputs[0] if node.inputs else None
        source = producers[first].name if first in producers else input_consumers.get(first or "")
        activation_size = math.prod(int(d or 1) for d in shapes[node.outputs[0]].shape[1:]) if node.outputs else 0
        nodes[node.name] = NodeSpace(node.name, node.op, candidates, int(weight.size) if weight is not None else 0, macs,
                                     source, activation_size)
    return TuningSpace(nodes)


def _read_by_its_consumers(name: str, candidates: tuple[NodeConfig, ...], readers: list[str],
                           capability: CapabilitySpec) -> tuple[NodeConfig, ...]:
    """The candidates whose output activation every op reading it takes: an activation wider than 8 bits only
    where each reader's capability entry offers that dtype too (its kernels then take it as input: the c
    target's 16-bit kernels, say), so no config holds a tensor a reader cannot run."""
    def readable(choice: NodeConfig) -> bool:
        if choice.activation is None or dtype_bits(choice.activation.dtype) <= 8:
            return True
        for op in readers:
            entry = capability.for_op(op).activation
            if entry is None or choice.activation.dtype not in entry.dtype:
                return False
        return True

    kept = tuple(choice for choice in candidates if readable(choice))
    if not kept:
        raise BuildError(f"node {name!r}: tuning.space leaves only activations wider than 8 bits, which an op "
                         f"reading it ({', '.join(sorted(set(readers)))}) does not take in capability "
                         f"{capability.name!r}")
    return kept


def _check_given_narrowing(graph: Graph, given: Mapping[str, Mapping[str, Any]], by_type: Mapping[str, Any],
                           by_name: Mapping[str, Any]) -> None:
    """BuildError where tuning.space narrows a role the model quantizes itself (on that node, or on every node of
    that op type): the model's quantization is kept, so the narrowing would do nothing."""
    for name, roles in by_name.items():
        for role in roles or {}:
            if role in given.get(name, {}):
                raise BuildError(f"tuning.space.op_name.{name}.{role}: the model quantizes this {role} itself "
                                 "(given quantization), so there is nothing to narrow")
    for op, roles in by_type.items():
        members = [node.name for node in graph.nodes if node.op == op]
        for role in roles or {}:
            if members and all(role in given.get(name, {}) for name in members):
                raise BuildError(f"tuning.space.op_type.{op}.{role}: the model quantizes the {role} of every {op} "
                                 "node itself (given quantization), so there is nothing to narrow")


def _given_roles(name: str, op: str, capability: CapabilitySpec,
                 roles: Mapping[str, tuple[QuantChoice, Any]]) -> dict[str, QuantChoice]:
    """The given choices of a node, each checked against the schemes the capability offers for its role."""
    entry = capability.for_op(op)
    for role, (choice, given) in roles.items():
        offered = getattr(entry, role)
        schemes = offered.scheme if offered is not None else ("pot", "sym", "asym")
        check_scheme(choice, given, schemes, f"node {name!r} ({op}), {role}", capability.name)
    return {role: choice for role, (choice, _) in roles.items()}


def _with_given(candidates: tuple[NodeConfig, ...], roles: Mapping[str, QuantChoice]) -> tuple[NodeConfig, ...]:
    """The candidates with each role the model quantizes fixed to its given choice (dabuild.quant.given_params)."""
    if not roles:
        return candidates
    fixed = [NodeConfig(roles.get("weight", c.weight), roles.get("activation", c.activation))
             for c in candidates if not c.fp32]
    return tuple(dict.fromkeys(fixed)) or candidates


def _check_names(graph: Graph, by_type: dict[str, Any], by_name: dict[str, Any]) -> None:
    op_types = sorted({node.op for node in graph.nodes})
    for op in by_type:
        if op not in op_types:
            raise BuildError(f"tuning.space.op_type: no node of op type {op!r} in the graph "
                             f"(op types: {', '.join(op_types)})")
    names = [node.name for node in graph.nodes]
    for name in by_name:
        if name not in names:
            close = difflib.get_close_matches(name, names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise BuildError(f"tuning.space.op_name: no node named {name!r} in the graph{hint} "
                             f"(nodes: {', '.join(names)})")


def _candidates(name: str, op: str, capability: CapabilitySpec, by_type: Mapping[str, Any],
                by_name: Mapping[str, Any], activation: str | None = None) -> tuple[NodeConfig, ...]:
    """The node's candidates: the product of its roles' narrowed choices, then fp32 if allowed and kept (where the
    capability has a float kernel for the op and for the `activation` fused into it)."""
    roles = quantizable_roles(op)
    entry = capability.for_op(op)
    keys = {role: _merge(by_type.get(role) or {}, by_name.get(role) or {}) for role in ("weight", "activation")}
    for role, fields in keys.items():
        if fields and role not in (roles or ()):
            where = _where(name, op, by_name, role)
            raise BuildError(f"{where}: op {op!r} has no {role} to quantize")
    dtype_lists = {role: fields["dtype"] for role, fields in keys.items() if "dtype" in fields}
    runs_float = capability.runs_float(op, activation) and not (op in OPS and OPS[op].reads_indices)
    for role, dtypes in dtype_lists.items():
        if FLOAT_DTYPE in dtypes and not runs_float:
            fused = f" with its fused {activation}" if activation not in (None, "none") else ""
            why = "does not allow fp32 fallback" if not capability.fp32_fallback else (
                f"runs no float island of op {op!r}{fused} (float_ops: {', '.join(capability.float_ops or [])}; an "
                "op reading integer indices never runs as one)")
            raise BuildError(f"{_where(name, op, by_name, role, 'dtype')}: capability {capability.name!r} {why}")
    keep_float = all(FLOAT_DTYPE in dtypes for dtypes in dtype_lists.values())
    fallback = (FP32,) if runs_float and keep_float else ()
    missing = [role for role in roles or () if getattr(entry, role) is None]
    if roles is None or missing:
        if fallback:
            return fallback
        reason = (f"op {op!r} has no integer lowering yet" if roles is None
                  else f"capability {capability.name!r} does not allow {missing[0]} quantization of op {op!r}")
        raise BuildError(f"node {name!r}: {reason}, and the capability does not allow fp32 fallback")
    per_role = []
    for role in roles:
        choices = _narrow(getattr(entry, role), keys[role], name, op, role, capability.name, by_name)
        per_role.append([QuantChoice(*values) for values in itertools.product(*choices)])
    integer = tuple(NodeConfig(**{"weight": None, "activation": None, **dict(zip(roles, picks))})
                    for picks in itertools.product(*per_role))
    candidates = integer + fallback
    if not candidates:
        raise BuildError(f"node {name!r} ({op}): tuning.space leaves no candidate config")
    return candidates


def _merge(by_type: Mapping[str, list[str]], by_name: Mapping[str, list[str]]) -> dict[str, list[str]]:
    return {**{k: v for k, v in by_type.items() if v is not None}, **{k: v for k, v in by_name.items() if v is not None}}


def _where(name: str, op: str, by_name: Mapping[str, Any], role: str, field: str | None = None) -> str:
    """The recipe key a problem comes from: op_name's if it sets this role (and field), else op_type's."""
    from_name = role in by_name and (field is None or field in (by_name[role] or {}))
    key = f"{role}.{field}" if field else role
    return f"tuning.space.op_name.{name}.{key}" if from_name else f"tuning.space.op_type.{op}.{key}"


def _narrow(offered: QuantChoices, wanted: Mapping[str, list[str]], name: str, op: str, role: str,
            capability: str, by_name: Mapping[str, Any]) -> list[list[str]]:
    """Each field's values: the capability's (dtypes dabuild lowers), kept in its order, cut to the recipe's."""
    lists = []
    for field in FIELDS:
        values = list(getattr(offered, field))
        if field == "dtype":
            values = [d for d in values if is_int_type(d)]
        default = values
        if field == "dtype" and role == "activation":   # wider activations (int16) on request only
            default = [d for d in values if dtype_bits(d) <= WIDE_BITS]
        asked = [v for v in wanted.get(field, default) if not (field == "dtype" and v == FLOAT_DTYPE)]
        for value in asked:
            if value not in values:
                offered_text = ", ".join(values) or "none"
                hint = (f"; dabuild lowers only {NAMES_TEXT}"
                        if field == "dtype" and value in getattr(offered, field) else "")
                raise BuildError(f"{_where(name, op, by_name, role, field)}: capability {capability!r} does not "
                                 f"offer {value!r} for {role}s of op {op!r} (offers: {offered_text}){hint}")
        lists.append([v for v in values if v in asked])
    if not lists[0] and "dtype" not in wanted:
        raise BuildError(f"node {name!r}: capability {capability!r} offers {role} dtypes "
                         f"{list(offered.dtype)} for op {op!r}; dabuild lowers only {NAMES_TEXT}")
    return lists
