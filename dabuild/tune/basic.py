"""The `basic` strategy: try the capability's default config.

Intel Neural Compressor's basic strategy starts from the default config and,
while the accuracy goal is missed, falls back op by op; that fallback search
lands with the tuning issue. Today this strategy evaluates the default config
only and reports that one trial, so the pipeline around it is real.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dabuild.ir.graph import Graph
from dabuild.quant.calibrate import Stats
from dabuild.quant.config import QuantConfig, default_config
from dabuild.quant.qgraph import QGraph
from dabuild.quant.quantize import quantize


class BasicStrategy:
    name = "basic"

    def tune(self, graph: Graph, stats: Stats, capability: Any,
             evaluate: Callable[[QGraph], float]) -> tuple[QuantConfig, list[dict[str, Any]]]:
        """The default config and its trial record; `evaluate` scores a quantized graph on the recipe's metric."""
        config = default_config(graph, capability)
        trial = {"trial": 0, "config_hash": config.content_hash(), "config": config.to_dict(),
                 "metric": evaluate(quantize(graph, stats, config))}
        return config, [trial]
