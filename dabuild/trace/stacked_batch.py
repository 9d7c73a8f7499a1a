"""Relax a fixed batch of 1 that the graph moves off axis 0, by running the one-sample graph over a stack.

A file that fixes the batch to 1 computes one sample. The onnx tracer first reads that 1 as the batch where it
stays on axis 0 (`Conversion.relaxed_batch`). Attention moves it: torch's MultiheadAttention transposes
(1, L, E) to (L, 1, E), folds it with the heads into (L, heads, E / heads) and back. `stack_batch` rewrites the
converted one-sample graph node by node so that every tensor gets the batch first again. Each tensor t of the
one-sample graph becomes either

- *folded*, (N, *t.shape[1:]), where t.shape[0] == 1: the batch replaces the fixed 1 (what the first try
  makes everywhere), or
- *stacked*, (N, *t.shape): sample i's t at [i].

A node whose variable inputs are all folded, whose outputs keep a leading 1 and whose op treats the samples
along axis 0 independently (`Op.samplewise`) runs as it is (a reshape whose target keeps the leading 1 copies
the batch instead). Any other node runs on stacked inputs with its axes shifted by one (`STACKED`, one rule per
op); an op without a rule that is samplewise runs on its stacked inputs folded, (N * k, ...). A reshape moves a
tensor between the two forms. Whatever the rules build is checked against the one-sample graph, sample by
sample, on two random samples before the tracer takes it; a graph no rule fits keeps its fixed batch and runs
sample by sample.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from dabuild.errors import BuildError, UsageError
from dabuild.ir.graph import Graph, Node, TensorSpec
from dabuild.ir.ops import OPS
from dabuild.ir.ops.activation import Activation
from dabuild.names import unique_name
from dabuild.registry import Registry

Shape = tuple[int, ...]
# op -> (its resolved attributes, the one-sample shapes of its inputs) -> the attributes over stacked inputs,
# or None when the rule cannot express the node (the relaxation then gives up and says which node).
StackedRule = Callable[[dict[str, Any], list[Shape]], "dict[str, Any] | None"]
STACKED: Registry[StackedRule] = Registry("stacked-batch rule", "the onnx tracer's batch relaxation")


def stacked(*names: str) -> Callable[[StackedRule], StackedRule]:
    return STACKED.register(*names)


def _shifted(axis: int, rank: int) -> int:
    return axis % rank + 1


@stacked(*(name for name, op in OPS.items() if isinstance(op, Activation)), "identity", "fake_quant")
def _same(attrs: dict[str, Any], shapes: list[Shape]) -> dict[str, Any] | None:
    """Elementwise: the stack is one more leading axis."""
    return attrs


BROADCASTING = ("add", "sub", "mul", "div", "max", "min", "prelu", "where", "matmul")


@stacked(*BROADCASTING)
def _broadcasting(attrs: dict[str, Any], shapes: list[Shape]) -> dict[str, Any] | None:
    """Broadcasting aligns axes from the end; the caller stacks every variable input (constants keep their
    rank), so variable inputs of one rank stay aligned. Differing ranks, or a 1-D matmul operand, would not."""
    return attrs


@stacked("dense")
def _dense(attrs: dict[str, Any], shapes: list[Shape]) -> dict[str, Any] | None:
    return attrs  # contracts the last axis; leading axes pass through


@stacked("transpose")
def _transpose(attrs: dict[str, Any], shapes: list[Shape]) -> dict[str, Any] | None:
    rank = len(shapes[0])
    perm = attrs["perm"] if attrs["perm"] is not None else list(range(rank - 1, -1, -1))
    return {**attrs, "perm": [0, *(axis + 1 for axis in perm)]}


@stacked("reshape")
def _reshape(attrs: dict[str, Any], shapes: list[Shape]) -> dict[str, Any] | None:
    return {**attrs, "shape": [0, *attrs["shape"]]}  # a 0 copies the input's axis at its (shifted) position


@stacked("gather", "concat", "split", "softmax", "log_softmax", "layer_norm")
def _axis(attrs: dict[str, Any], shapes: list[Shape]) -> dict[str, Any] | None:
    return {**attrs, "axis": _shifted(attrs["axis"], len(shapes[0]))}


@stacked("slice")
def _slice(attrs: dict[str, Any], shapes: list[Shape]) -> dict[str, Any] | None:
    axes = attrs["axes"] if attrs["axes"] is not None else range(len(attrs["starts"]))
    return {**attrs, "axes": [_shifted(axis, len(shapes[0])) for axis in axes]}


@stacked("squeeze")
def _squeeze(attrs: dict[str, Any], shapes: list[Shape]) -> dict[str, Any] | None:
    shape = shapes[0]
    axes = attrs["axes"] if attrs["axes"] is not None else [a for a, size in enumerate(shape) if size == 1]
    return {**attrs, "axes": [_shifted(axis, len(shape)) for axis in axes]}


@stacked("unsqueeze")
def _unsqueeze(attrs: dict[str, Any], shapes: list[Shape]) -> dict[str, Any] | None:
    rank = len(shapes[0]) + len(attrs["axes"])
    return {**attrs, "axes": [_shifted(axis, rank) for axis in attrs["axes"]]}


@stacked("reduce_mean", "reduce_sum", "reduce_max")
def _reduce(attrs: dict[str, Any], shapes: list[Shape]) -> dict[str, Any] | None:
    rank = len(shapes[0])
    axes = attrs["axes"] if attrs["axes"] else range(rank)
    return {**attrs, "axes": [_shifted(axis, rank) for axis in axes]}


@stacked("pad")
def _pad(attrs: dict[str, Any], shapes: list[Shape]) -> dict[str, Any] | None:
    rank = len(shapes[0])
    return {**attrs, "pads": [0, *attrs["pads"][:rank], 0, *attrs["pads"][rank:]]}


@stacked("tile")
def _tile(attrs: dict[str, Any], shapes: list[Shape]) -> dict[str, Any] | None:
    return {**attrs, "repeats": [1, *attrs["repeats"]]}


@stacked("expand")
def _expand(attrs: dict[str, Any], shapes: list[Shape]) -> dict[str, Any] | None:
    shape, rank = list(attrs["shape"]), len(shapes[0])
    return None if len(shape) > rank else {**attrs, "shape": [1] * (rank + 1 - len(shape)) + shape}


def _static(spec: TensorSpec) -> Shape:
    """A one-sample graph's tensors have every size known (its inputs fix the batch to 1)."""
    if None in spec.shape:
        raise BuildError(f"tensor {spec.name!r} has a dynamic size in the one-sample graph")
    return tuple(int(size) for size in spec.shape if size is not None)


class Stacker:
    """The rewrite of one graph. A folded tensor keeps its one-sample name; a stacked one gets a fresh name."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.shapes = {name: _static(spec) for name, spec in graph.tensor_shapes().items()}
        self.nodes: list[Node] = []
        self.taken = set(self.shapes) | {node.name for node in graph.nodes}
        self.folded = {spec.name for spec in graph.inputs}
        self.stacked: dict[str, str] = {}

    def reshape(self, source: str, output: str, shape: list[int]) -> str:
        self.nodes.append(Node(unique_name(f"{output}_reshape", self.taken), "reshape", [source], [output],
                               {"shape": shape}))
        return output

    def as_folded(self, tensor: str) -> str:
        if tensor not in self.folded:
            self.reshape(self.stacked[tensor], tensor, [-1, *self.shapes[tensor][1:]])
            self.folded.add(tensor)
        return tensor

    def as_stacked(self, tensor: str) -> str:
        if tensor not in self.stacked:
            self.stacked[tensor] = self.reshape(self.as_folded(tensor), unique_name(f"{tensor}_stacked", self.taken),
                                                [-1, *self.shapes[tensor]])
        return self.stacked[tensor]

    def as_samples(self, tensor: str) -> str:
        """(N * k, *t.shape[1:]) for a one-sample tensor t of shape (k, ...): the samples' t one after another."""
        if self.shapes[tensor][:1] == (1,):
            return self.as_folded(tensor)
        return self.reshape(self.as_stacked(tensor), unique_name(f"{tensor}_samples", self.taken),
                            [-1, *self.shapes[tensor][1:]])

    def variable(self, tensor: str) -> bool:
        return tensor not in self.graph.constants

    def rewrite(self, node: Node) -> None:
        """Append `node` over folded inputs where it treats samples independently there, else over stacked
        ones with its axes shifted, else (a samplewise op without a rule) over its stacked inputs folded."""
        op, attrs = OPS[node.op], OPS[node.op].resolve(node.attrs)
        variables = [name for name in node.inputs if self.variable(name)]
        if node.op not in (*BROADCASTING, "concat") and any(self.variable(name) for name in node.inputs[1:]):
            raise BuildError(f"node {node.name!r} ({node.op}) takes a per-sample tensor as a parameter")
        in_shapes = [self.shapes[name] for name in variables]
        stays_folded = all(self.shapes[name][:1] == (1,) for name in [*variables, *node.outputs])
        same_rank = len({len(shape) for shape in in_shapes}) <= 1
        if node.op in BROADCASTING:  # batch axes line up, and no constant of the output's rank varies along them
            rank = len(self.shapes[node.outputs[0]])
            stays_folded = stays_folded and same_rank and all(
                len(self.shapes[name]) < rank or self.shapes[name][:1] == (1,)
                for name in node.inputs if not self.variable(name))
        if stays_folded:
            folded_attrs = attrs
            if node.op == "reshape" and attrs["shape"][0] in (0, 1):  # each whole sample reshaped alone
                folded_attrs = {**attrs, "shape": [0, *attrs["shape"][1:]]}
            if op.samplewise(folded_attrs):
                self.emit(node, [self.as_folded(name) if self.variable(name) else name for name in node.inputs],
                          folded_attrs)
                return
        if node.op == "flatten":  # a reshape of the stack
            shape, axis = in_shapes[0], attrs["axis"] % (len(in_shapes[0]) + 1)
            self.emit(node, [self.as_stacked(node.inputs[0])],
                      {"shape": [0, math.prod(shape[:axis]), math.prod(shape[axis:])]}, stacked=True, op="reshape")
            return
        if node.op in STACKED and same_rank and not (node.op == "matmul" and any(len(s) < 2 for s in in_shapes)):
            shifted = STACKED[node.op](attrs, in_shapes)
            if shifted is not None:
                self.emit(node, [self.as_stacked(name) if self.variable(name) else name for name in node.inputs],
                          shifted, stacked=True)
                return
        if op.samplewise(attrs) and node.op not in BROADCASTING and len({shape[:1] for shape in in_shapes}) == 1:
            outputs = [name if self.shapes[name][:1] == (1,) else unique_name(f"{name}_samples", self.taken)
                       for name in node.outputs]
            self.nodes.append(Node(node.name, node.op, [self.as_samples(name) if self.variable(name) else name
                                                        for name in node.inputs], outputs, attrs))
            for name, output in zip(node.outputs, outputs):
                if output == name:
                    self.folded.add(name)
                else:
                    self.stacked[name] = self.reshape(output, unique_name(f"{name}_stacked", self.taken),
                                                      [-1, *self.shapes[name]])
            return
        raise BuildError(f"node {node.name!r} ({node.op}) acts on the batch axis it moved")

    def emit(self, node: Node, inputs: list[str], attrs: dict[str, Any], stacked: bool = False,
             op: str | None = None) -> None:
        outputs = list(node.outputs)
        if stacked:
            outputs = [unique_name(f"{name}_stacked", self.taken) for name in node.outputs]
            self.stacked.update(zip(node.outputs, outputs))
        else:
            self.folded.update(outputs)
        self.nodes.append(Node(node.name, op or node.op, inputs, outputs, attrs))


def stack_batch(graph: Graph) -> Graph:
    """`graph` (every input fixing its batch to 1) over any batch; BuildError naming the node no rule fits.

    Outputs must keep a leading 1 (their batch); the result is checked against `graph` on two random samples.
    """
    unbatched = [spec.name for spec in graph.inputs if spec.shape[:1] != (1,)]
    if unbatched:
        raise BuildError(f"input {unbatched[0]!r} has no batch of 1 first")
    stacker = Stacker(graph)
    for node in graph.nodes:
        stacker.rewrite(node)
    pinned = [name for name in graph.outputs if stacker.shapes[name][:1] != (1,)]
    if pinned:
        raise BuildError(f"output {pinned[0]!r} has no batch axis first")
    for name in graph.outputs:
        stacker.as_folded(name)
    relaxed = Graph([TensorSpec(spec.name, (None, *spec.shape[1:]), spec.dtype) for spec in graph.inputs],
                    list(graph.outputs), stacker.nodes, graph.constants, graph.given)
    relaxed.tensor_shapes()
    _agrees(graph, relaxed)
    return relaxed


def _agrees(graph: Graph, relaxed: Graph) -> None:
    """BuildError unless `relaxed` on two random samples gives what `graph` gives on each alone."""
    from dabuild.ir.interpreter import run

    rng = np.random.default_rng(0)
    feeds = {spec.name: rng.normal(size=(2, *_static(spec)[1:])).astype(spec.dtype) for spec in graph.inputs}
    try:
        together = run(relaxed, feeds)
    except (UsageError, BuildError, ValueError) as error:  # a shape the stacked graph cannot take at run time
        raise BuildError(f"the stacked graph does not run on two samples: {error}") from None
    alone = [run(graph, {name: array[i:i + 1] for name, array in feeds.items()}) for i in range(2)]
    for name in graph.outputs:
        want = np.concatenate([part[name] for part in alone])
        scale = max(float(np.max(np.abs(want), initial=0.0)), 1e-12)
        if together[name].shape != want.shape or float(np.max(np.abs(together[name] - want))) > 1e-4 * scale:
            raise BuildError(f"the stacked graph's output {name!r} differs from the one-sample graph's")
