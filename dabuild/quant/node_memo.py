"""Each node's lowering remembered by everything it reads, so a config is lowered from the nodes it changed.

Tuning prices hundreds of configs (objective `size`, a cost model) that differ from the ones priced before in a
node or two; lowering a whole ResNet for each took a tenth of a second. A node's lowering reads the graph and the
statistics (fixed for a run), its own config, and of the context only what concerns its own tensors: the
quantization (or float shape) of its inputs, which of its inputs and outputs stay float (the island), and the
parameters the model gives them. Under that key `NodeLowerings` keeps the layers it made and what it added to the
context (its output tensors, the constants it owns, its float tensors), and replays them.

The layers are shared by every graph lowered from them: a graph lowered so is for measuring, never changed. A
graph whose fake_quant nodes rename tensors (`quantize._renamed`, which renames layers in place) is lowered whole.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dabuild.ir.graph import Graph, TensorSpec
from dabuild.qir.qgraph import QLayer, QTensor
from dabuild.quant.lowering import Lowering


@dataclass(frozen=True)
class Lowered:
    """What lowering one node made: its layers, and the entries it set in the context's tables."""

    layers: tuple[QLayer, ...]
    tensors: tuple[tuple[str, QTensor], ...]
    constants: tuple[tuple[str, np.ndarray], ...]
    floats: tuple[tuple[str, tuple[int, ...]], ...]

    def arrays(self) -> list[np.ndarray]:
        return [*(array for layer in self.layers for array in layer.arrays().values()),
                *(values for _, values in self.constants)]


class NodeLowerings:
    """Lowered nodes by key, holding at most `budget` bytes of arrays (over it, it forgets them all). An array
    several entries share (a weight whose node was lowered again for a new input quantization) counts once."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.lowered = 0  # nodes lowered (not replayed): what the memo saved is the rest
        self._entries: dict[Hashable, Lowered] = {}
        self._counted: set[int] = set()  # ids of the arrays the entries hold (alive while they are)
        self._bytes = 0
        self._shapes: tuple[Graph, dict[str, TensorSpec]] | None = None

    def tensor_shapes(self, graph: Graph) -> dict[str, TensorSpec]:
        """`graph.tensor_shapes()`, inferred once for the graph a run lowers (lowering only reads them)."""
        if self._shapes is None or self._shapes[0] is not graph:
            self._shapes = (graph, graph.tensor_shapes())
        return self._shapes[1]

    def lower(self, ctx: Lowering, lowering: Callable[[Lowering], list[QLayer]]) -> list[QLayer]:
        """The layers `lowering` makes of `ctx.node`, its additions to `ctx` made as it makes them."""
        key = _key(ctx)
        entry = self._entries.get(key)
        if entry is None:
            tensors, constants, floats = dict(ctx.tensors), dict(ctx.constants), dict(ctx.floats)
            layers = lowering(ctx)
            entry = Lowered(tuple(layers), _added(tensors, ctx.tensors), _added(constants, ctx.constants),
                            _added(floats, ctx.floats))
            self.lowered += 1
            arrays = {id(array): array for array in entry.arrays() if id(array) not in self._counted}
            added = sum(array.nbytes for array in arrays.values())
            if self._bytes + added > self.budget:
                self._entries.clear()
                self._counted.clear()
                self._bytes = 0
                arrays = {id(array): array for array in entry.arrays()}
                added = sum(array.nbytes for array in arrays.values())
            self._entries[key] = entry
            self._counted.update(arrays)
            self._bytes += added
            return layers
        ctx.tensors.update(entry.tensors)
        ctx.constants.update(entry.constants)
        ctx.floats.update(entry.floats)
        return list(entry.layers)


def _added(before: dict[str, Any], after: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """The entries `after` has that `before` had not, or held another object under."""
    return tuple((name, value) for name, value in after.items() if before.get(name, _ABSENT) is not value)


_ABSENT = object()


def _key(ctx: Lowering) -> Hashable:
    """The node, its config, and for each of its tensors what the context holds of it."""
    node = ctx.node

    def seen(tensor: str) -> Hashable:
        lowered = ctx.tensors.get(tensor)
        return (tensor, None if lowered is None else (lowered.shape, lowered.params), ctx.floats.get(tensor),
                tensor in ctx.island, ctx.given.get(tensor), tensor in ctx.constants)

    return (node.name, ctx.config, tuple(seen(t) for t in node.inputs), tuple(seen(t) for t in node.outputs))
