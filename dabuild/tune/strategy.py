"""What strategies share: the plugin interface and the moves they make on a config.

A strategy is a class registered under the `dabuild.strategies` entry-point
group; `search(search)` proposes configs through `Search.evaluate` and returns
when it has nothing more to propose (the driver may stop it sooner).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Protocol

from dabuild.quant.config import NodeConfig, QuantConfig
from dabuild.tune.space import FP32, NodeSpace, dtype_bits

if TYPE_CHECKING:
    from dabuild.tune.search import Search


class Strategy(Protocol):
    name: ClassVar[str]

    def search(self, search: "Search") -> None: ...


def ranked_nodes(search: "Search") -> list[str]:
    """Nodes with a choice to make, most sensitive first (per-node output MSE under the default config)."""
    errors = search.node_errors()
    names = [name for name, node in search.space.nodes.items() if len(node.candidates) > 1]
    return sorted(names, key=lambda name: -errors.get(name, 0.0))


def _bits(choice: NodeConfig) -> tuple[int, int]:
    return (dtype_bits(choice.weight.dtype if choice.weight else None),
            dtype_bits(choice.activation.dtype if choice.activation else None))


def _shared_fields(a: NodeConfig, b: NodeConfig) -> int:
    """How many of the role fields two choices agree on: the smaller the move, the more they share."""
    shared = 0
    for x, y in ((a.weight, b.weight), (a.activation, b.activation)):
        if x is not None and y is not None:
            shared += sum(getattr(x, f) == getattr(y, f) for f in ("dtype", "scheme", "granularity", "algorithm"))
    return shared


def precise_choice(node: NodeSpace, current: NodeConfig) -> NodeConfig:
    """The node's safest candidate: fp32 when allowed, else the widest, closest to `current`."""
    if FP32 in node.candidates:
        return FP32
    return max(node.candidates, key=lambda c: (_bits(c), _shared_fields(c, current), c == current))


def _roles_changed(a: NodeConfig, b: NodeConfig) -> int:
    return (a.weight != b.weight) + (a.activation != b.activation)


def cheaper_choices(search: "Search", config: QuantConfig, name: str) -> list[NodeConfig]:
    """Node `name`'s choices one cost level below `config` (the smallest saving), changing as few roles as possible.

    Every choice at that level, not only the one closest to the current: from
    int8 weights, each int4 weight choice (any scheme, granularity and range
    algorithm) with the activation kept, since which of them hurts least is
    the node's to measure, not the field order's to decide. In candidate order.
    """
    cost = search.cost(config)
    current = config.nodes[name]
    levels: dict[int, list[NodeConfig]] = {}
    for choice in search.space.nodes[name].candidates:
        moved_cost = search.cost(search.space.with_node(config, name, choice))
        if moved_cost < cost:
            levels.setdefault(moved_cost, []).append(choice)
    if not levels:
        return []
    level = levels[max(levels)]
    fewest = min(_roles_changed(choice, current) for choice in level)
    return [choice for choice in level if _roles_changed(choice, current) == fewest]
