"""Evaluating nodes whose inputs are all known while loading: constants and shape arithmetic.

Exporters compute reshape targets, pads and split sizes with small subgraphs
(`Shape -> Gather -> Unsqueeze -> Concat -> Reshape`). dabuild's graphs are
static, so such subgraphs are run once at load time with onnx's own reference
evaluator, whatever ops they use, and their results become attributes.

A shape may hold the dynamic batch size, which is unknown while loading. Such a
value is an object array with None in the unknown places. To evaluate a node
over it, the unknowns are replaced by a stand-in size and the node runs twice
with two different stand-ins: an output element equal to the stand-in in both
runs is the batch size passed through (None again); one that differs in any
other way was computed from it, which a static graph cannot express.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from onnx import helper
from onnx.reference import ReferenceEvaluator

from dabuild.trace.onnx_frontend.conversion import is_partial
from dabuild.trace.onnx_frontend.model_file import OnnxNode

# Two sizes no real tensor has, so an element equal to one of them is the batch passing through.
_STAND_INS = (1_000_003, 2_000_029)


class DependsOnBatch(ValueError):
    """A load-time value is computed from the dynamic batch size, not just copied from it."""


def _substitute(value: np.ndarray, stand_in: int) -> np.ndarray:
    if not is_partial(value):
        return value
    return np.array([stand_in if item is None else item for item in value.ravel()], dtype=np.int64).reshape(
        value.shape
    )


def _run(node: OnnxNode, inputs: list[np.ndarray | None], opset: int) -> list[np.ndarray]:
    """Run the node under the model's own opset: wrapped in a one-node model that imports it (a bare
    NodeProto would be evaluated under the newest schema, where an opset-9 Unsqueeze has no `axes` input)."""
    feeds: dict[str, Any] = {name: value for name, value in zip(node.inputs, inputs) if name}
    graph = helper.make_graph(
        [node.proto], "fold", [helper.make_empty_tensor_value_info(name) for name in feeds],
        [helper.make_empty_tensor_value_info(name) for name in node.outputs if name],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    evaluator = ReferenceEvaluator(model)
    return [np.asarray(result) for result in evaluator.run(None, feeds)]


def _size(values: np.ndarray | None) -> list[int]:
    """Known sizes from a load-time shape value (the dynamic batch, None, counts as 1)."""
    if values is None:
        return []
    return [abs(int(item)) if item is not None else 1 for item in np.asarray(values).ravel()]


def output_elements(node: OnnxNode, inputs: list[np.ndarray | None]) -> int | None:
    """How many elements the node's output will hold, for the ops whose output can dwarf their inputs (a
    1 KB file may ask ConstantOfShape for 10^9 floats); None for every other op."""
    if node.op_type == "ConstantOfShape" and inputs:
        return math.prod(_size(inputs[0]))
    if node.op_type == "Expand" and len(inputs) > 1 and inputs[0] is not None:
        target, source = _size(inputs[1]), list(np.shape(inputs[0]))
        width = max(len(target), len(source))
        target, source = [1] * (width - len(target)) + target, [1] * (width - len(source)) + source
        return math.prod(max(a, b) for a, b in zip(target, source))
    if node.op_type == "Tile" and len(inputs) > 1 and inputs[0] is not None:
        return int(np.size(inputs[0])) * math.prod(_size(inputs[1]))
    if node.op_type == "Range" and len(inputs) == 3 and all(value is not None for value in inputs):
        start, limit, delta = (float(np.asarray(value).ravel()[0]) for value in inputs)
        return max(0, math.ceil((limit - start) / delta)) if delta else 0
    return None


def evaluate(node: OnnxNode, inputs: list[np.ndarray | None], opset: int) -> list[np.ndarray]:
    """The node's outputs from known inputs (None for an omitted optional input)."""
    if not any(value is not None and is_partial(value) for value in inputs):
        return _run(node, inputs, opset)
    first, second = (
        _run(node, [None if value is None else _substitute(value, stand_in) for value in inputs], opset)
        for stand_in in _STAND_INS
    )
    results = []
    for a, b in zip(first, second):
        if np.array_equal(a, b):
            results.append(a)
            continue
        passed_through = (a == _STAND_INS[0]) & (b == _STAND_INS[1])
        if not np.all(passed_through | (a == b)):
            raise DependsOnBatch(f"{node.op_type} computes with the dynamic batch size")
        results.append(np.where(passed_through, None, a.astype(object)))  # type: ignore[call-overload]  # numpy's stub refuses None, an object array's element
    return results
