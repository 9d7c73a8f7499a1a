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

    def search(self, search: Search) -> None: ...


def ranked_nodes(search: Search) -> list[str]:
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


def one_field_moves(node: NodeSpace, current: NodeConfig) -> list[NodeConfig]:
    """The node's integer candidates that differ from `current` in exactly one field of one role (another
    range algorithm, granularity, scheme or type): a handful, where the full product may hold hundreds."""
    def apart(choice: NodeConfig) -> bool:
        differences = 0
        for x, y in ((choice.weight, current.weight), (choice.activation, current.activation)):
            if (x is None) != (y is None):
                return False
            if x is not None:
                differences += sum(getattr(x, f) != getattr(y, f) for f in ("dtype", "scheme", "granularity",
                                                                              "algorithm"))
        return differences == 1

    return [choice for choice in node.candidates if not choice.fp32 and apart(choice)]


def precise_choice(node: NodeSpace, current: NodeConfig) -> NodeConfig:
    """The node's safest candidate: fp32 when allowed, else the widest, closest to `current`."""
    if FP32 in node.candidates:
        return FP32
    return max(node.candidates, key=lambda c: (_bits(c), _shared_fields(c, current), c == current))


def _widths(node: NodeSpace, role: str) -> list[int]:
    """The bit widths the node's integer candidates offer for `role`, ascending."""
    return sorted({dtype_bits(getattr(c, role).dtype) for c in node.candidates if getattr(c, role) is not None})


def width_steps(node: NodeSpace, current: NodeConfig) -> list[NodeConfig]:
    """The node's candidates one width below `current` in one role, the other role kept as it is.

    Every candidate at that width, whatever its scheme, granularity, range
    algorithm or signedness, since which of them hurts least is the node's to
    measure, not the field order's to decide: from int8 weights, each int7
    (or, if the capability skips it, int6...) weight choice with the
    activation unchanged, and each 7-bit activation choice with the weight
    unchanged. From fp32, every candidate at the widest integer widths. A
    handful of candidates out of possibly hundreds, in candidate order.
    """
    if current.fp32:
        widest = max((_bits(c) for c in node.candidates if not c.fp32), default=None)
        return [c for c in node.candidates if not c.fp32 and _bits(c) == widest]
    steps: list[NodeConfig] = []
    for role, other in (("weight", "activation"), ("activation", "weight")):
        choice = getattr(current, role)
        if choice is None:
            continue
        lower = [w for w in _widths(node, role) if w < dtype_bits(choice.dtype)]
        if lower:
            steps += [c for c in node.candidates if getattr(c, other) == getattr(current, other)
                      and getattr(c, role) is not None and dtype_bits(getattr(c, role).dtype) == lower[-1]]
    return steps


def cheaper_choices(search: Search, config: QuantConfig, name: str) -> list[NodeConfig]:
    """Node `name`'s one-width steps down (see `width_steps`) that the objective prices below `config`.

    Only these few are priced, not every candidate: with many widths a node
    has hundreds, and a cost estimate (da4ml's) is far dearer than a bit count.
    """
    cost = search.cost(config)
    return [choice for choice in width_steps(search.space.nodes[name], config.nodes[name])
            if search.cost(search.space.with_node(config, name, choice)) < cost]
