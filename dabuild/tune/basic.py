"""The `basic` strategy: Intel Neural Compressor's basic order, with the op-wise phase ranked by sensitivity.

1. the default config;
2. op-type-wise: each alternative choice applied to every node of an op type
   (the best one, if it beats the default, becomes the base);
3. op-wise: each node's fp32 fallback, then each of its other candidates, one
   node at a time on the base; nodes in order of their measured impact (per-node
   output MSE), not graph order, so the node that matters is tried first;
4. accumulate: every node's best single-node change, applied cumulatively,
   best-scoring first, until the goal is met.
Configs that cannot be cheaper than the best passing one are never evaluated.
Once a passing config has the least cost the space allows, the search driver
spends a bounded pass on equally cheap configs (`looks_among_equals`), so the
default passing at once still leaves per-channel weights or other ranges a try.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from dabuild.quant.config import QuantConfig
from dabuild.tune.space import FP32
from dabuild.tune.strategy import ranked_nodes

if TYPE_CHECKING:
    from dabuild.tune.search import Search
    from dabuild.tune.trials import Trial


def op_type_configs(search: "Search", base: QuantConfig) -> list[QuantConfig]:
    """Each non-default integer choice of an op type, set on all its nodes (those that offer it)."""
    space = search.space
    configs = []
    op_types = list(dict.fromkeys(node.op for node in space.nodes.values()))
    for op in op_types:
        members = [node for node in space.nodes.values() if node.op == op]
        choices = dict.fromkeys(c for node in members for c in node.candidates if c != FP32)
        for choice in choices:
            config = QuantConfig({**base.nodes, **{n.name: choice for n in members if choice in n.candidates}})
            if config != base:
                configs.append(config)
    return configs


class BasicStrategy:
    name: ClassVar[str] = "basic"
    looks_among_equals: ClassVar[bool] = True

    def search(self, search: "Search") -> None:
        space = search.space
        [base] = search.evaluate([space.default()], "default")
        better = search.metric.better
        for trial in search.evaluate_each(op_type_configs(search, base.config), "op-type-wise"):
            if better(trial.metric, base.metric):
                base = trial
        ranked = ranked_nodes(search)
        moves = [(name, FP32) for name in ranked if FP32 in space.nodes[name].candidates]
        moves += [(name, c) for name in ranked for c in space.nodes[name].candidates if c != FP32]
        moves = [(name, c) for name, c in moves if c != base.config.nodes[name]]
        configs = [space.with_node(base.config, name, choice) for name, choice in moves]
        search.evaluate_each(configs, "op-wise")
        changes: dict[str, Trial] = {}
        for (name, _), config in zip(moves, configs):
            trial = search.seen(config)
            if trial is not None and (name not in changes or better(trial.metric, changes[name].metric)):
                changes[name] = trial
        order = sorted(changes, key=lambda name: changes[name].metric, reverse=search.metric.higher_is_better)
        config, prefixes = base.config, []
        for name in order:
            config = space.with_node(config, name, changes[name].config.nodes[name])
            prefixes.append(config)
        search.evaluate_each(prefixes, "accumulate")
