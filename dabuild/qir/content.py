"""Hashable keys of what a QLayer holds, for caches that remember a figure per layer (what a target stores for it).

Tuning prices hundreds of configs that differ from one another in a node or two; a layer whose content and
surroundings are unchanged need not be priced again. The key must name exactly what decides the figure, so it
covers every field of the layer, arrays by a digest of their type, shape and bytes. A layer's key is made once
while the layer lives: a priced graph's layers are shared by the configs that lower those nodes alike
(`dabuild.quant.node_memo`), so a ResNet's weights are digested once per distinct lowering, not per config.
Layers are not changed once lowered.
"""

from __future__ import annotations

import hashlib
import json
import weakref
from collections.abc import Hashable
from typing import Any

import numpy as np

from dabuild.qir.qgraph import QLayer


class ContentKeys:
    """Makes content keys of layers and arrays, each layer's once while it lives."""

    def __init__(self) -> None:
        self._layers: dict[int, tuple[weakref.ref[QLayer], Hashable]] = {}  # id -> (the layer, its key)

    @staticmethod
    def array(values: np.ndarray) -> Hashable:
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
        made = self._layers.get(id(layer))
        if made is not None and made[0]() is layer:
            return made[1]
        fields = {"name": layer.name, "inputs": layer.inputs, "outputs": layer.outputs,
                  **layer.attrs(), **layer.arrays()}
        key = (type(layer).__name__, self.value(fields))
        identity = id(layer)
        self._layers[identity] = (weakref.ref(layer, lambda _: self._layers.pop(identity, None)), key)
        return key


_EXTREMES: dict[int, tuple[weakref.ref[np.ndarray], tuple[int, int]]] = {}


def extremes(values: np.ndarray) -> tuple[int, int]:
    """The least and greatest of a non-empty integer array; of a read-only array that owns its data (nothing can
    change it: the weight cache's integer weights), found once while it lives, as every priced config's export
    asks again (a ResNet-50's weights are 25 M values)."""
    if values.flags.writeable or values.base is not None:
        return int(values.min()), int(values.max())
    identity = id(values)
    known = _EXTREMES.get(identity)
    if known is None or known[0]() is not values:
        known = (weakref.ref(values, lambda _: _EXTREMES.pop(identity, None)), (int(values.min()), int(values.max())))
        _EXTREMES[identity] = known
    return known[1]
