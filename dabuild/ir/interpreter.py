"""Reference execution of a Graph with the numpy kernels of the op registry.

This is dabuild's float ground truth: calibration observes it, tuning scores
against it, and targets are checked against what it (or its integer twin) says.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from dabuild.errors import UsageError
from dabuild.ir.graph import Graph, TensorSpec
from dabuild.ir.ops import OPS
from dabuild.ir.ops.base import Kernel


def _shape_text(shape: tuple[int | None, ...]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def _fits(spec: TensorSpec, shape: tuple[int, ...]) -> bool:
    return len(shape) == len(spec.shape) and all(
        want is None or want == got for want, got in zip(spec.shape, shape)
    )


def validate_feeds(graph: Graph, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Feeds as arrays of each input's dtype; UsageError naming any wrong, missing or misshaped input."""
    names = {spec.name for spec in graph.inputs}
    unknown = sorted(set(feeds) - names)
    if unknown:
        expected = ", ".join(f"{spec.name} {_shape_text(spec.shape)}" for spec in graph.inputs)
        raise UsageError(f"unknown graph input {', '.join(map(repr, unknown))}; the graph takes {expected}")
    arrays: dict[str, np.ndarray] = {}
    for spec in graph.inputs:
        if spec.name not in feeds:
            raise UsageError(f"missing graph input {spec.name!r} (expected shape {_shape_text(spec.shape)})")
        array = np.asarray(feeds[spec.name], dtype=spec.dtype)
        if not _fits(spec, array.shape):
            raise UsageError(
                f"graph input {spec.name!r} has shape {_shape_text(array.shape)}; "
                f"expected {_shape_text(spec.shape)} (? = any size)"
            )
        arrays[spec.name] = array
    return arrays


@dataclass
class Step:
    """One node of a plan: its prepared kernel, where its arrays come from and go, and what dies after it."""

    kernel: Kernel
    inputs: list[str]
    outputs: list[str]
    finished: list[str]  # tensors nothing after this node reads (graph outputs and constants excluded)
    overwritable: list[int]  # positions of finished inputs an in-place op may write its output into


class Interpreter:
    """A graph prepared once for many batches: attributes resolved, kernels bound, tensor lifetimes known.

    Without `keep_intermediates`, each intermediate is dropped after its last
    reader, and an op that can (add, relu, conv, ...) writes its output into an
    input that dies with it when nothing else refers to that memory, so a
    residual block does not allocate (and page-fault in) a fresh tensor per op.
    The graph must not change while an Interpreter of it is in use.
    """

    def __init__(self, graph: Graph):
        self.graph = graph
        last: dict[str, int] = {}
        for index, node in enumerate(graph.nodes):
            for name in node.inputs:
                last[name] = index
        keep = set(graph.outputs) | set(graph.constants) | {spec.name for spec in graph.inputs}
        self.steps: list[Step] = []
        for index, node in enumerate(graph.nodes):
            op = OPS[node.op]
            finished = sorted({name for name in node.inputs if last[name] == index and name not in keep})
            overwritable = [position for position in op.in_place
                            if node.inputs[position] in finished and node.inputs.count(node.inputs[position]) == 1]
            self.steps.append(Step(op.prepare(node.attrs), list(node.inputs), list(node.outputs), finished,
                                   overwritable))

    def run(self, feeds: dict[str, np.ndarray], keep_intermediates: bool = False) -> dict[str, np.ndarray]:
        """The graph outputs by name; with `keep_intermediates`, every input and node output as well."""
        graph = self.graph
        values: dict[str, np.ndarray] = dict(graph.constants)
        values.update(validate_feeds(graph, feeds))
        for step in self.steps:
            arrays = [values[name] for name in step.inputs]
            out = None
            if not keep_intermediates:
                for name in step.finished:
                    del values[name]
                out = _overwritable(arrays, step.overwritable)
            values.update(zip(step.outputs, step.kernel(arrays, out)))
        if keep_intermediates:
            return {name: array for name, array in values.items() if name not in graph.constants}
        return {name: values[name] for name in graph.outputs}


def _overwritable(arrays: list[np.ndarray], positions: list[int]) -> np.ndarray | None:
    """The first input array at one of `positions` that nothing but the `arrays` list reaches, or None.

    An identity, reshape or slice can make two tensors share one buffer, and
    writing into a buffer that a live tensor still shows would change that
    tensor. CPython's reference counts tell, compared with the counts of an
    array nothing else refers to. Whether the output fits the array is the
    kernel's decision.
    """
    for position in positions:
        if _references(arrays, position) != _ALONE:  # counted before `array` below adds a reference
            continue
        array = arrays[position]
        if not array.flags.writeable:
            continue
        if array.base is None or (isinstance(array.base, np.ndarray) and _base_references(array) == _ALONE_BASE):
            return array
    return None


def _references(arrays: list[np.ndarray], position: int) -> int:
    return sys.getrefcount(arrays[position])


def _base_references(view: np.ndarray) -> int:
    return sys.getrefcount(view.base)


_ALONE = _references([np.empty(1)], 0)  # only the list refers to the array
_ALONE_BASE = _base_references(np.empty(1)[:])  # only the view refers to its base


def run(graph: Graph, feeds: dict[str, np.ndarray], keep_intermediates: bool = False) -> dict[str, np.ndarray]:
    """The graph outputs by name; with `keep_intermediates`, every input and node output as well.

    Prepares the graph on every call; code running one graph on many batches keeps an `Interpreter`.
    """
    return Interpreter(graph).run(feeds, keep_intermediates)


def trace_layers(graph: Graph, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The per-layer trace for debug bundles: every node output by tensor name, in graph order."""
    values = run(graph, feeds, keep_intermediates=True)
    return {name: values[name] for node in graph.nodes for name in node.outputs}
