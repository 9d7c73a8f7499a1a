"""The `basic` strategy: Intel Neural Compressor's basic order, within the trial budget.

1. the default config;
2. op-type-wise: alternative choices applied to every node of an op type
   (the best one, if it beats the default, becomes the base). INC enumerates
   every candidate per op type, which on a capability with many fields is a
   product larger than the budget (156 trials on a 9-node CNN), so fallback
   is never reached. Here the one-field moves come first (INC's op-type-wise
   tuning, one field at a time), then a seeded sample of the remaining
   combinations, all together at most `OP_TYPE_SHARE` of `max_trials`;
3. op-wise: each node's fp32 fallback (a float island), then each of its
   candidates one field away from the base's choice (not the whole product,
   for the same reason), one node at a time on the base; nodes in order of
   their measured impact (per-node output MSE), not graph order;
4. accumulate: every node's best single-node change, applied cumulatively,
   best-scoring first, until the goal is met;
5. cheaper: once a config passes, cheaper ones are still tried — every node
   at the narrowest width the best passing config uses for each role (where
   the node offers it), then each node's one-width steps down — until no
   cheaper config passes.
Configs that cannot be cheaper than the best passing one are never evaluated.
The rule that stops it: basic stops as soon as the best passing config's cost
can no longer fall, that is when it has the least cost the space allows (the
driver stops there), or when no config one step cheaper passes (phase 5 ends).
It never spends a trial on a config as cheap as the best passing one: the
objective, not the score, chooses. The stop reason names the phase that ended
the search.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from dabuild.quant.config import QuantConfig
from dabuild.tune.space import FP32, TuningSpace, dtype_bits
from dabuild.tune.strategy import cheaper_choices, one_field_moves, ranked_nodes

if TYPE_CHECKING:
    from dabuild.tune.search import Search
    from dabuild.tune.trials import Trial

OP_TYPE_SHARE = 0.25  # the most of max_trials the op-type-wise phase may take


def op_type_configs(search: Search, base: QuantConfig) -> list[QuantConfig]:
    """Each non-default integer choice of an op type set on all its nodes (those that offer it): the one-field
    moves first, then a seeded sample of the rest, at most OP_TYPE_SHARE of the budget in all."""
    space = search.space
    moves = [config for op in space.op_types() for config in space.field_moves(base, op)]
    others = []
    for op in space.op_types():
        members = [node for node in space.nodes.values() if node.op == op]
        for choice in dict.fromkeys(c for node in members for c in node.candidates if c != FP32):
            config = QuantConfig({**base.nodes, **{n.name: choice for n in members if choice in n.candidates}})
            if config != base and config not in moves:
                others.append(config)
    room = max(1, int(search.budget.max_trials * OP_TYPE_SHARE))
    if len(moves) + len(others) <= room:
        return moves + others
    rng = np.random.default_rng(search.seed)
    sample = [others[i] for i in sorted(rng.choice(len(others), max(0, room - len(moves)), replace=False))]
    return (moves + sample)[:room]


def narrowest_everywhere(space: TuningSpace, config: QuantConfig) -> QuantConfig:
    """`config` with each node's weight and activation at the narrowest width `config` uses for that role
    anywhere, where the node offers that width with its other fields unchanged."""
    nodes = dict(config.nodes)
    for role in ("weight", "activation"):
        used = [getattr(c, role) for c in config.nodes.values() if getattr(c, role) is not None]
        if not used:
            continue
        narrowest = min(used, key=lambda choice: dtype_bits(choice.dtype)).dtype
        for name, node in space.nodes.items():
            current = getattr(nodes[name], role)
            if current is None:
                continue
            narrowed = dataclasses.replace(nodes[name], **{role: dataclasses.replace(current, dtype=narrowest)})
            if narrowed in node.candidates:
                nodes[name] = narrowed
    return QuantConfig(nodes)


class BasicStrategy:
    name: ClassVar[str] = "basic"

    def search(self, search: Search) -> None:
        space = search.space
        [base] = search.evaluate([space.default()], "default")
        better = search.metric.better
        for trial in search.evaluate_each(op_type_configs(search, base.config), "op-type-wise"):
            if better(trial.metric, base.metric):
                base = trial
        ranked = ranked_nodes(search)
        moves = [(name, FP32) for name in ranked if FP32 in space.nodes[name].candidates]
        moves += [(name, c) for name in ranked for c in one_field_moves(space.nodes[name], base.config.nodes[name])]
        moves = [(name, c) for name, c in moves if c != base.config.nodes[name]]
        configs = [space.with_node(base.config, name, choice) for name, choice in moves]
        search.evaluate_each(configs, "op-wise")
        changes: dict[str, Trial] = {}
        for (name, _), config in zip(moves, configs):
            seen = search.seen(config)
            if seen is not None and (name not in changes or better(seen.metric, changes[name].metric)):
                changes[name] = seen
        order = sorted(changes, key=lambda name: changes[name].metric, reverse=search.metric.higher_is_better)
        config, prefixes = base.config, []
        for name in order:
            config = space.with_node(config, name, changes[name].config.nodes[name])
            prefixes.append(config)
        search.evaluate_each(prefixes, "accumulate")
        self._cheaper(search)

    @staticmethod
    def _cheaper(search: Search) -> None:
        """Configs cheaper than the best passing one, until none of them passes."""
        space = search.space
        while (best := search.best()) is not None:
            configs = [narrowest_everywhere(space, best.config)]
            configs += [space.with_node(best.config, name, choice)
                        for name in space.nodes for choice in cheaper_choices(search, best.config, name)]
            fresh = [c for c in configs if search.seen(c) is None and search.could_improve(c)]
            if not fresh or not any(t.passed for t in search.evaluate_each(fresh, "cheaper")):
                return
