"""The `mixed-precision` strategy: the least cost (weight bits, BOPs or a backend's estimate) that meets the goal.

For capabilities with several widths. From the default (raised node by node,
most sensitive first, until it passes, if it does not), each node's choices
one width down in one role that the objective prices cheaper — all of them:
every scheme, granularity and range algorithm at the lower width (see
`width_steps`), a handful however many candidates the node has — are ranked
by the node's own output error with that choice alone (per-node MSE, one
inference each, no trial), because the
cheapest choice nearest the current one (int4 minmax from int8 minmax) may
hurt far more than another at the same width (int4 mse). Then: probe each
node's least harmful lower choice alone; rank the nodes by output-MSE
increase per unit of cost saved; lower them cumulatively in that order while
the goal holds; then refine: keep trying single steps down on the best config,
the least increase of the node's own output error per unit of cost saved
first, and keep each that passes, until none does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from dabuild.quant.config import QuantConfig
from dabuild.tune.strategy import cheaper_choices, precise_choice, ranked_nodes

if TYPE_CHECKING:
    from dabuild.tune.search import Search
    from dabuild.tune.trials import Trial


class MixedPrecisionStrategy:
    name: ClassVar[str] = "mixed-precision"

    def search(self, search: Search) -> None:
        space = search.space
        config = space.default()
        raised = [config]
        for name in ranked_nodes(search):
            choice = precise_choice(space.nodes[name], config.nodes[name])
            if choice != config.nodes[name]:
                config = space.with_node(config, name, choice)
                raised.append(config)
        search.evaluate(raised, "raise", until_pass=True)
        start = search.best()
        if start is None:
            return

        def harm(config: QuantConfig, name: str) -> float:
            """Node `name`'s output error under `config` (one inference, cached by the search)."""
            return search.node_errors(config).get(name, 0.0)

        def steps_down(config: QuantConfig, name: str) -> list[QuantConfig]:
            """`config` with node `name` one width cheaper, least harmful choice first; of choices alike in
            harm and cost (power-of-two scales often make range algorithms agree) only the first."""
            candidates = space.nodes[name].candidates
            steps = sorted((space.with_node(config, name, choice) for choice in cheaper_choices(search, config, name)),
                           key=lambda step: (harm(step, name), candidates.index(step.nodes[name])))
            distinct: dict[tuple[float, int], QuantConfig] = {}
            for step in steps:
                distinct.setdefault((harm(step, name), search.cost(step)), step)
            return list(distinct.values())

        probes = {name: steps[0] for name in space.nodes if (steps := steps_down(start.config, name))}
        trials = dict(zip(probes, search.evaluate(list(probes.values()), "probe")))

        def harm_per_saving(name: str) -> float:
            trial = trials[name]
            return max(trial.mse - start.mse, 0.0) / max(start.cost - trial.cost, 1)

        order = sorted((name for name, trial in trials.items() if trial.passed), key=harm_per_saving)
        config, prefixes = start.config, []
        for name in order:
            config = space.with_node(config, name, probes[name].nodes[name])
            prefixes.append(config)
        search.evaluate(prefixes, "greedy", until_fail=True)

        def increase_per_saving(best: Trial, name: str, step: QuantConfig) -> float:
            increase = max(harm(step, name) - harm(best.config, name), 0.0)
            return increase / max(best.cost - search.cost(step), 1)

        while True:
            best = search.best()
            assert best is not None
            ranked = [(increase_per_saving(best, name, step), rank, step) for name in space.nodes
                      for rank, step in enumerate(steps_down(best.config, name)) if search.seen(step) is None]
            steps = [step for *_, step in sorted(ranked, key=lambda entry: entry[:2])]
            if not steps or not any(t.passed for t in search.evaluate(steps, "refine", until_pass=True)):
                return
