"""The `random` strategy: the default config, then configs drawn uniformly per node (seeded by `tuning.seed`).

Draws that cannot beat the best passing config, or were seen already, are not
evaluated; the draw sequence depends only on the seed, so runs repeat exactly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np

from dabuild.quant.config import QuantConfig

if TYPE_CHECKING:
    from dabuild.tune.search import Search

BATCH = 8  # draws scored together (fixed, so -j N records what -j 1 does)
PATIENCE = 50  # batches in a row with nothing worth evaluating before giving up


class RandomStrategy:
    name: ClassVar[str] = "random"

    def search(self, search: Search) -> None:
        space = search.space
        rng = np.random.default_rng(search.seed)
        search.evaluate([space.default()], "default")
        idle = 0
        while idle < PATIENCE:
            draws = [QuantConfig({name: node.candidates[int(rng.integers(len(node.candidates)))]
                                  for name, node in space.nodes.items()}) for _ in range(BATCH)]
            worth = [c for c in draws if search.seen(c) is None and search.could_improve(c)]
            idle = 0 if worth else idle + 1
            search.evaluate_each(worth, "random")
