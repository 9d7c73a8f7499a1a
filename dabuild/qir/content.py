"""Hashable keys of what a QLayer holds, for caches that remember a figure per layer (what a target stores for it).

Tuning prices hundreds of configs that differ from one another in a node or two; a layer whose content and
surroundings are unchanged need not be priced again. The key must name exactly what decides the figure, so it
covers every field of the layer, arrays by content: a read-only array (the weight cache's integer weights, shared
by every config that keeps the node's weight choice) by identity, held alive by the keys so its identity is never
reused; any other array (biases, multipliers, tables: small, and new on every lowering) by a digest of its type,
shape and bytes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Hashable
from typing import Any

import numpy as np

from dabuild.qir.qgraph import QLayer


class ContentKeys:
    """Makes content keys of layers and arrays; the read-only arrays it has keyed by identity live as long as it."""

    def __init__(self) -> None:
        self._held: dict[int, np.ndarray] = {}

    def array(self, values: np.ndarray) -> Hashable:
        if not values.flags.writeable:
            self._held.setdefault(id(values), values)
            return ("held", id(values))
        digest = hashlib.blake2b(np.ascontiguousarray(values).tobytes(), digest_size=16).hexdigest()
        return (str(values.dtype), values.shape, digest)

    def value(self, value: Any) -> Hashable:
        """An array's key, or a value's (nested lists, dicts and layers included)."""
        if isinstance(value, np.ndarray):
            return self.array(value)
        if isinstance(value, QLayer):
            return self.layer(value)
        if isinstance(value, dict):
            return tuple(sorted((str(k), self.value(v)) for k, v in value.items()))
        if isinstance(value, (list, tuple)):
            return tuple(self.value(v) for v in value)
        return json.dumps(value, sort_keys=True, default=repr)

    def layer(self, layer: QLayer) -> Hashable:
        """Every field of `layer` (its name and tensors' names included) and its class."""
        fields = {"name": layer.name, "inputs": layer.inputs, "outputs": layer.outputs,
                  **layer.attrs(), **layer.arrays()}
        return (type(layer).__name__, self.value(fields))
