"""The `mixed-precision` strategy: the lowest total weight bits (or BOPs) that still meets the goal.

For capabilities with several widths. From the default (raised node by node,
most sensitive first, until it passes, if it does not), probe each node one
cost level down alone; rank the nodes by output-MSE increase per unit of cost
saved; lower them cumulatively in that order while the goal holds; then
refine: keep trying single steps down on the best config (the cheapest
saving first) and keep each that passes, until none does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from dabuild.tune.strategy import precise_choice, ranked_nodes, step_down

if TYPE_CHECKING:
    from dabuild.tune.search import Search


class MixedPrecisionStrategy:
    name: ClassVar[str] = "mixed-precision"

    def search(self, search: "Search") -> None:
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
        probes = {name: step_down(search, start.config, name) for name in space.nodes}
        probes = {name: config for name, config in probes.items() if config is not None}
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
        while True:
            best = search.best()
            assert best is not None
            steps = [step_down(search, best.config, name) for name in space.nodes]
            steps = sorted((c for c in steps if c is not None and search.seen(c) is None),
                           key=lambda c: -search.cost(c))
            if not steps or not any(t.passed for t in search.evaluate(steps, "refine", until_pass=True)):
                return
