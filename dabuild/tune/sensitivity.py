"""The `sensitivity` strategy: rank nodes by per-node output MSE against float, fall back in that order.

The ranking costs one inference and no trial. Nodes move to their safest
candidate (fp32 where the capability allows it) cumulatively, most sensitive
first, until the goal is met; then each fallback is tried undone again, least
sensitive first, keeping every undo that still passes (it is cheaper).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from dabuild.tune.strategy import precise_choice, ranked_nodes

if TYPE_CHECKING:
    from dabuild.tune.search import Search


class SensitivityStrategy:
    name: ClassVar[str] = "sensitivity"

    def search(self, search: Search) -> None:
        space = search.space
        default = space.default()
        config, prefixes, fallen = default, [default], []
        for name in ranked_nodes(search):
            choice = precise_choice(space.nodes[name], config.nodes[name])
            if choice != config.nodes[name]:
                config = space.with_node(config, name, choice)
                prefixes.append(config)
                fallen.append(name)
        search.evaluate(prefixes, "fall back", until_pass=True)
        for name in reversed(fallen):
            best = search.best()
            if best is None:
                return
            if best.config.nodes[name] != default.nodes[name]:
                search.evaluate_each([space.with_node(best.config, name, default.nodes[name])], f"undo {name}")
