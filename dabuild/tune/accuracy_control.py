"""The `accuracy-control` strategy, in the spirit of NNCF's `quantize_with_accuracy_control`.

1. cheapest: every node at its cheapest choice (fewest weight bits, then
   activation bits; per-channel weights and then the capability's order
   among equals). Scored on the subset first, like every config after it:
   one full evaluation if the subset expects it to pass, done if the full
   set agrees; a config the subset fails is not worth a full evaluation
   (NNCF spends one on its starting point whatever happens, which is why it
   needs three where the start misses and one restoration carries the goal).
2. rank: each node's harm is what restoring it alone to its safest choice (a
   float island where the capability runs them, else its widest type)
   recovers of the metric, measured on a subset of the evaluation data
   (`Search.subset_metric`: a cheap estimate, not a trial; for accuracy
   and top-k the subset holds the rows nearest the float decisions and
   estimates the whole set's score, see `Evaluator.subset`); ties go to the
   node's own output error, on the same subset.
3. restore, most harmful first, one node at a time: the node's restoration
   is the best-scoring on the subset of its safer choices (another range
   algorithm or granularity, a wider type, a float island: one-field moves
   from its current choice plus the safest), the cheapest among equals.
   Once the subset says the config passes, the restorations are first
   taken back on the subset (each restored node, least harmful first, at
   its cheapest choice the subset still passes with) and that lighter
   config is confirmed on the full set (a trial); if it misses, the config
   as restored is; configs the subset says miss are not evaluated.
4. take back: each restored node, least harmful first, is tried at cheaper
   choices again (its cheapest first, then its safer choices by cost), the
   first that the subset and then the full set pass kept: a float island
   restored first may come back as per-channel weights once other
   restorations carry the goal.

So full evaluations are spent only on configs the subset expects to pass
(`Search.subset_predicts_pass`: the subset passes them, and scores them
above every config the full set already failed — near the goal a 300-row
subset's verdict is noise, and a subset score that once went with a full
miss is no evidence of a pass): two or three on a model where one node hurts.
Counting as bench/hard_cases.py does (and as NNCF's validation calls on the
full set are counted): the float baseline's pass plus one per trial; subset
scores are not full evaluations, and the strategy makes no other pass over
the full evaluation data (its per-node errors are the subset's too; the
report's sensitivity column, written after the search, is one more pass). When nothing passes, the most
harmful nodes of step 2 are what the miss names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from dabuild.quant.config import NodeConfig, QuantConfig
from dabuild.tune.space import NodeSpace, dtype_bits
from dabuild.tune.strategy import one_field_moves, precise_choice

if TYPE_CHECKING:
    from dabuild.tune.search import Search


def _bits(choice: NodeConfig) -> tuple[int, int]:
    return (dtype_bits(choice.weight.dtype if choice.weight else None),
            dtype_bits(choice.activation.dtype if choice.activation else None))


def cheapest_choice(node: NodeSpace) -> NodeConfig:
    """The node's candidate with the fewest weight bits, then activation bits; among equals per-channel
    weights (a scale per channel costs next to nothing and is where NNCF and onnxruntime's per_channel start),
    then the capability's order."""
    return min(node.candidates, key=lambda c: (_bits(c), c.weight is not None and c.weight.granularity != "per_channel",
                                               node.candidates.index(c)))


def safer_choices(node: NodeSpace, current: NodeConfig) -> list[NodeConfig]:
    """The candidates differing from `current` in one field of one role (range algorithm, granularity, scheme,
    a wider type), and the node's safest candidate: the restorations worth measuring."""
    moves = [c for c in one_field_moves(node, current) if _bits(c) >= _bits(current)]
    safest = precise_choice(node, current)
    return moves + ([safest] if safest != current and safest not in moves else [])


class AccuracyControlStrategy:
    name: ClassVar[str] = "accuracy-control"

    def search(self, search: Search) -> None:
        space = search.space
        sign = 1 if search.metric.higher_is_better else -1
        cheapest = QuantConfig({name: cheapest_choice(node) for name, node in space.nodes.items()})
        if search.subset_predicts_pass(cheapest) and search.evaluate([cheapest], "cheapest")[0].passed:
            return
        choosing = [name for name, node in space.nodes.items() if precise_choice(node, cheapest.nodes[name])
                    != cheapest.nodes[name]]
        base = search.subset_metric(cheapest)
        recovered = {name: sign * (search.subset_metric(space.with_node(
            cheapest, name, precise_choice(space.nodes[name], cheapest.nodes[name]))) - base) for name in choosing}
        errors = search.node_errors(cheapest, subset=True)
        ranked = sorted(choosing, key=lambda name: (-recovered[name], -errors.get(name, 0.0)))
        search.harmful = ranked
        config, restored = cheapest, []
        for name in ranked:  # those that recover nothing alone last: together they may still
            config = space.with_node(config, name, self._restoration(search, config, name, sign))
            restored.append(name)
            if not search.subset_predicts_pass(config):
                continue
            lighter = self._taken_back_on_subset(search, config, restored, cheapest)
            if search.evaluate([lighter], f"restore {name}")[0].passed:
                break
            if lighter != config and search.evaluate([config], f"restore {name}")[0].passed:
                break
        else:
            search.evaluate([config], "restore all")
        for name in reversed(restored):
            best = search.best()
            if best is None:
                return
            choices = [*safer_choices(space.nodes[name], cheapest.nodes[name]), cheapest.nodes[name]]
            for choice in sorted(choices, key=lambda c: search.cost(space.with_node(best.config, name, c))):
                undone = space.with_node(best.config, name, choice)
                if not search.could_improve(undone) or not search.subset_predicts_pass(undone):
                    continue
                if search.evaluate([undone], f"take back {name}")[0].passed:
                    break

    @staticmethod
    def _taken_back_on_subset(search: Search, config: QuantConfig, restored: list[str],
                              cheapest: QuantConfig) -> QuantConfig:
        """`config` with each restored node, least harmful first, at its cheapest choice the subset still
        passes with: the take-back, judged on the subset before a full evaluation is spent."""
        space = search.space
        for name in reversed(restored):
            choices = [*safer_choices(space.nodes[name], cheapest.nodes[name]), cheapest.nodes[name]]
            for choice in sorted(choices, key=lambda c: search.cost(space.with_node(config, name, c))):
                undone = space.with_node(config, name, choice)
                if search.cost(undone) < search.cost(config) and search.subset_predicts_pass(undone):
                    config = undone
                    break
        return config

    @staticmethod
    def _restoration(search: Search, config: QuantConfig, name: str, sign: int) -> NodeConfig:
        """Node `name`'s safer choice scoring best on the subset (the cheapest of equals): take-back makes it
        cheaper later, if the goal allows."""
        space = search.space
        options = [space.with_node(config, name, choice) for choice in safer_choices(space.nodes[name],
                                                                                    config.nodes[name])]
        return min(options, key=lambda step: (-sign * search.subset_metric(step), search.cost(step))).nodes[name]
