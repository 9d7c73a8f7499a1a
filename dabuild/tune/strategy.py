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


def step_down(search: "Search", config: QuantConfig, name: str) -> QuantConfig | None:
    """`config` with node `name` one cost level cheaper (the smallest saving, closest choice), or None."""
    cost = search.cost(config)
    current = config.nodes[name]
    options = []
    for order, choice in enumerate(search.space.nodes[name].candidates):
        moved = search.space.with_node(config, name, choice)
        moved_cost = search.cost(moved)
        if moved_cost < cost:
            options.append((-moved_cost, -_shared_fields(choice, current), order, moved))
    return min(options, key=lambda option: option[:3])[3] if options else None
