"""QuantConfig: the quantization choice made for every node, the output of tuning.

A choice is one pick from each list of a capability entry (dtype, scheme,
granularity, algorithm). The config is what the tuner searches over and what
the cache keys the quantize stage on, so it saves as canonical JSON and has a
stable content hash.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# Which tensors of each op type quantization touches; ops missing here have no integer lowering
# (they can only run in fp32). Every quantized node has an activation choice, even where its output
# keeps its input's params (layout ops, max_pool, relu/relu6/clip) or has fixed ones (softmax:
# 1/256, -128): the choice's dtype still applies, and only NodeConfig(None, None) means fp32.


@dataclass(frozen=True)
class QuantChoice:
    """How one tensor (a weight or an activation) is quantized."""

    dtype: str
    scheme: str
    granularity: str
    algorithm: str


@dataclass(frozen=True)
class NodeConfig:
    """The choices for a node's weight (None for weightless ops) and its output activation.

    `NodeConfig(weight=None, activation=None)` means fp32 fallback: the node
    runs its float kernel between dequantized inputs and an output quantized
    with its calibrated minmax range. Only targets whose capability has
    `fp32_fallback: true` can run it; `default_config` never emits it.
    """

    weight: QuantChoice | None
    activation: QuantChoice | None

    @property
    def fp32(self) -> bool:
        return self.weight is None and self.activation is None


@functools.cache
def _node_json(cfg: NodeConfig) -> str:
    return json.dumps(asdict(cfg), sort_keys=True, separators=(",", ":"))


@dataclass
class QuantConfig:
    nodes: dict[str, NodeConfig] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"nodes": {name: asdict(cfg) for name, cfg in sorted(self.nodes.items())}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> QuantConfig:
        def choice(value: dict[str, str] | None) -> QuantChoice | None:
            return None if value is None else QuantChoice(**value)

        return cls({name: NodeConfig(choice(cfg["weight"]), choice(cfg["activation"]))
                    for name, cfg in data["nodes"].items()})

    def canonical_json(self) -> str:
        """json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":")), from each node's cached text: a
        search hashes hundreds of configs that share their NodeConfigs, and asdict of every node dominated."""
        nodes = ",".join(f"{json.dumps(name)}:{_node_json(cfg)}" for name, cfg in sorted(self.nodes.items()))
        return f'{{"nodes":{{{nodes}}}}}'

    def content_hash(self) -> str:
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()

    def save(self, path: Path) -> None:
        """Write the config as JSON to the file `path` (sorted keys: equal configs, equal bytes)."""
        Path(path).write_text(json.dumps(self.to_dict(), sort_keys=True, indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> QuantConfig:
        return cls.from_dict(json.loads(Path(path).read_text()))
