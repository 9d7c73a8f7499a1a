"""Reference execution of a Graph with the numpy kernels of the op registry.

This is dabuild's float ground truth: calibration observes it, tuning scores
against it, and targets are checked against what it (or its integer twin) says.
"""

from __future__ import annotations

import numpy as np

from dabuild.errors import UsageError
from dabuild.ir.graph import Graph, TensorSpec
from dabuild.ir.ops import OPS


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


def _last_reads(graph: Graph) -> list[list[str]]:
    """For each node, the tensors nothing after it reads (graph outputs and constants excluded)."""
    last: dict[str, int] = {}
    for index, node in enumerate(graph.nodes):
        for name in node.inputs:
            last[name] = index
    keep = set(graph.outputs) | set(graph.constants)
    done: list[list[str]] = [[] for _ in graph.nodes]
    for name, index in last.items():
        if name not in keep:
            done[index].append(name)
    return done


def run(graph: Graph, feeds: dict[str, np.ndarray], keep_intermediates: bool = False) -> dict[str, np.ndarray]:
    """The graph outputs by name; with `keep_intermediates`, every input and node output as well.

    Without it, each intermediate is dropped after its last reader, so a large
    batch holds only the tensors still needed.
    """
    values: dict[str, np.ndarray] = dict(graph.constants)
    values.update(validate_feeds(graph, feeds))
    finished = None if keep_intermediates else _last_reads(graph)
    for index, node in enumerate(graph.nodes):
        results = OPS[node.op].run([values[name] for name in node.inputs], node.attrs)
        values.update(zip(node.outputs, results))
        if finished is not None:
            for name in finished[index]:
                del values[name]
    if keep_intermediates:
        return {name: array for name, array in values.items() if name not in graph.constants}
    return {name: values[name] for name in graph.outputs}


def trace_layers(graph: Graph, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The per-layer trace for debug bundles: every node output by tensor name, in graph order."""
    values = run(graph, feeds, keep_intermediates=True)
    return {name: values[name] for node in graph.nodes for name in node.outputs}
