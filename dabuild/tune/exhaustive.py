"""The `exhaustive` strategy: every config of the space, cheapest first, until one passes.

Configs are ordered by cost, then by how few nodes differ from the default,
so the first passing config is a cheapest one and everything after it is
skipped. A space too large to list is an error asking to narrow it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from dabuild.errors import BuildError

if TYPE_CHECKING:
    from dabuild.tune.search import Search

MAX_CONFIGS = 200_000


class ExhaustiveStrategy:
    name: ClassVar[str] = "exhaustive"

    def search(self, search: Search) -> None:
        space = search.space
        total = space.total()
        if total > MAX_CONFIGS:
            raise BuildError(f"strategy exhaustive: the tuning space holds {total} configs (more than "
                             f"{MAX_CONFIGS}); narrow it with tuning.space or use another strategy")
        default = space.default()
        configs = list(space.all_configs())
        keys = [(search.cost(config), sum(config.nodes[n] != default.nodes[n] for n in space.nodes), index)
                for index, config in enumerate(configs)]
        search.evaluate_each([configs[key[2]] for key in sorted(keys)], "exhaustive")
