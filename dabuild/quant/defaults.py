"""The default config: every node quantized with the first choice its capability lists, for the ops integer
lowering takes. It sits above lowering (it asks which roles each op quantizes), which sits above the config
types (quant/config.py), so neither needs the other lazily."""

from __future__ import annotations

from typing import Protocol

from dabuild.errors import BuildError
from dabuild.ir.graph import Graph
from dabuild.qir.dtypes import NAMES_TEXT, is_int_type
from dabuild.quant.config import NodeConfig, QuantChoice, QuantConfig
from dabuild.quant.lowering import FLOAT_ONLY, LOWERINGS, float_only_message, quantizable_roles


class _Choices(Protocol):
    dtype: list[str]
    scheme: list[str]
    granularity: list[str]
    algorithm: list[str]


class _OpCapability(Protocol):
    weight: _Choices | None
    activation: _Choices | None


class _Capability(Protocol):
    name: str

    def for_op(self, op_type: str) -> _OpCapability: ...


def _first_choice(choices: _Choices | None, node: str, op: str, role: str, capability: str) -> QuantChoice:
    """The default pick: the first entry of each list, with a dtype integer lowering supports (dtypes.is_int_type)."""
    if choices is None:
        raise BuildError(f"node {node!r}: capability {capability!r} does not allow {role} quantization "
                         f"of op {op!r}")
    dtypes = [d for d in choices.dtype if is_int_type(d)]
    if not dtypes:
        raise BuildError(f"node {node!r}: capability {capability!r} offers {role} dtypes {choices.dtype} "
                         f"for op {op!r}; dabuild lowers only {NAMES_TEXT}")
    return QuantChoice(dtypes[0], choices.scheme[0], choices.granularity[0], choices.algorithm[0])


def default_config(graph: Graph, capability: _Capability) -> QuantConfig:
    """Every node quantized with the first choice its capability entry lists."""
    nodes: dict[str, NodeConfig] = {}
    for node in graph.nodes:
        roles = quantizable_roles(node.op)
        if roles is None and node.op in FLOAT_ONLY:
            raise BuildError(float_only_message(node.name, node.op))
        if roles is None:
            raise BuildError(f"node {node.name!r}: op {node.op!r} has no integer lowering yet "
                             f"(quantizable ops: {', '.join(LOWERINGS.names())})")
        op_capability = capability.for_op(node.op)
        picks = {role: _first_choice(getattr(op_capability, role), node.name, node.op, role, capability.name)
                 for role in roles}
        nodes[node.name] = NodeConfig(picks.get("weight"), picks.get("activation"))
    return QuantConfig(nodes)
