"""The `accuracy-control` strategy, in the spirit of NNCF's `quantize_with_accuracy_control`.

1. cheapest: every node at its cheapest choice (fewest weight bits, then
   activation bits; the capability's order among equals). One full
   evaluation; done if it meets the goal.
2. rank: each node's harm is what restoring it alone to its safest choice (a
   float island where the capability runs them, else its widest type)
   recovers of the metric, measured on a subset of the evaluation data
   (`Search.subset_metric`: a cheap estimate, not a trial); ties go to the
   node's own output error. Nodes that recover nothing are not touched.
3. restore, most harmful first, one node at a time: the node's restoration
   is the cheapest of its safer choices (another range algorithm or
   granularity, a wider type, a float island: one-field moves from its
   current choice plus the safest) whose subset score is within half the
   tolerable loss of the best of them. After each restoration, a config
   the subset says passes is confirmed on the full set (a trial); one it
   says misses is not evaluated, until no node is left to restore.
4. take back: restorations are undone again, least harmful first, each kept
   undone when the full set still passes (only configs the subset says
   pass are evaluated).

So full evaluations are spent only on configs the subset expects to pass:
two or three on a model where one node hurts. When nothing passes, the most
harmful nodes of step 2 are what the miss names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from dabuild.quant.config import NodeConfig, QuantConfig
from dabuild.tune.space import FP32, NodeSpace, dtype_bits
from dabuild.tune.strategy import one_field_moves, precise_choice

if TYPE_CHECKING:
    from dabuild.tune.search import Search


def _bits(choice: NodeConfig) -> tuple[int, int]:
    return (dtype_bits(choice.weight.dtype if choice.weight else None),
            dtype_bits(choice.activation.dtype if choice.activation else None))


def cheapest_choice(node: NodeSpace) -> NodeConfig:
    """The node's candidate with the fewest weight bits, then activation bits; the earliest among equals."""
    return min(node.candidates, key=lambda c: (_bits(c), node.candidates.index(c)))


def safer_choices(node: NodeSpace, current: NodeConfig) -> list[NodeConfig]:
    """The candidates differing from `current` in one field of one role (range algorithm, granularity, scheme,
    a wider type), and the node's safest candidate: the restorations worth measuring."""
    moves = [c for c in one_field_moves(node, current) if _bits(c) >= _bits(current)]
    safest = precise_choice(node, current)
    return moves + ([safest] if safest != current and safest not in moves else [])


class AccuracyControlStrategy:
    name: ClassVar[str] = "accuracy-control"

    def search(self, search: "Search") -> None:
        space = search.space
        sign = 1 if search.metric.higher_is_better else -1
        slack = search.goal.tolerable_loss * (abs(search.baseline) if search.goal.criterion == "relative" else 1) / 2
        cheapest = QuantConfig({name: cheapest_choice(node) for name, node in space.nodes.items()})
        [start] = search.evaluate([cheapest], "cheapest")
        if start.passed:
            return
        choosing = [name for name, node in space.nodes.items() if precise_choice(node, cheapest.nodes[name])
                    != cheapest.nodes[name]]
        base = search.subset_metric(cheapest)
        recovered = {name: sign * (search.subset_metric(space.with_node(
            cheapest, name, precise_choice(space.nodes[name], cheapest.nodes[name]))) - base) for name in choosing}
        errors = search.node_errors(cheapest)
        ranked = sorted(choosing, key=lambda name: (-recovered[name], -errors.get(name, 0.0)))
        search.harmful = ranked
        config, restored = cheapest, []
        for name in [name for name in ranked if recovered[name] > 0] or ranked:
            config = space.with_node(config, name, self._restoration(search, config, name, sign, slack))
            restored.append(name)
            if search.subset_passes(config) and search.evaluate([config], f"restore {name}")[0].passed:
                break
        else:
            search.evaluate([config], "restore all")
        for name in reversed(restored):
            best = search.best()
            if best is None:
                return
            undone = space.with_node(best.config, name, cheapest.nodes[name])
            if undone != best.config and search.subset_passes(undone) and search.could_improve(undone):
                search.evaluate([undone], f"take back {name}")

    @staticmethod
    def _restoration(search: "Search", config: QuantConfig, name: str, sign: int, slack: float) -> NodeConfig:
        """The cheapest safer choice of node `name` scoring on the subset within `slack` of the best of them."""
        space = search.space
        options = [space.with_node(config, name, choice) for choice in safer_choices(space.nodes[name],
                                                                                    config.nodes[name])]
        scores = {step.content_hash(): sign * search.subset_metric(step) for step in options}
        best = max(scores.values())
        good = [step for step in options if scores[step.content_hash()] >= best - slack]
        return min(good, key=lambda step: (search.cost(step), -scores[step.content_hash()])).nodes[name]
