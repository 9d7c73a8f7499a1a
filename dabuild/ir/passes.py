"""Graph-to-graph rewrites that bring a freshly traced graph into canonical form.

Frontends spell one layer many ways (matmul + add, conv + batch_norm + relu,
identity nodes, weights transposed at run time). Later stages handle one
spelling only: constants folded, and a `conv` or `dense` node carrying its bias,
its folded batch norm and its activation. Every pass returns a new Graph,
leaves its argument untouched, and keeps the graph's output names: a fused node
writes the tensor the last node it absorbs wrote.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from dabuild.ir.given_quant import OP as FAKE_QUANT
from dabuild.ir.given_quant import GivenQuant, check_given
from dabuild.ir.graph import Graph, Node, TensorSpec
from dabuild.ir.ops import OPS, Activation
from dabuild.ir.ops.linear import batch_norm_affine
from dabuild.names import unique_name

WEIGHTED = ("conv", "dense")  # the ops that take a bias, a folded batch norm and an activation


def check_shapes(graph: Graph) -> dict[str, TensorSpec]:
    """Shape inference over the whole graph; BuildError naming the first node that does not fit."""
    return graph.tensor_shapes()


def remove_dead_code(graph: Graph) -> Graph:
    """Drop nodes no graph output depends on, and constants no remaining node reads."""
    needed = set(graph.outputs)
    kept: list[Node] = []
    for node in reversed(graph.nodes):
        if needed.intersection(node.outputs):
            kept.append(node)
            needed.update(node.inputs)
    constants = {name: array for name, array in graph.constants.items() if name in needed}
    given = {name: quant for name, quant in graph.given.items() if name in constants}
    return replace(graph, nodes=kept[::-1], constants=constants, given=given)


def fold_constants(graph: Graph) -> Graph:
    """Run every node whose inputs are all constants now, and keep its outputs as constants.

    Given quantization (ir/given_quant.py) survives folding: a fake_quant over a
    constant becomes a record in `Graph.given` for its result, and an identity
    or transpose of a recorded constant carries the record along.
    """
    constants = dict(graph.constants)
    given = dict(graph.given)
    nodes: list[Node] = []
    for node in graph.nodes:
        if node.inputs and all(name in constants for name in node.inputs):
            results = OPS[node.op].run([constants[name] for name in node.inputs], node.attrs)
            constants.update((name, np.ascontiguousarray(array)) for name, array in zip(node.outputs, results))
            source = given.get(node.inputs[0])
            if node.op == FAKE_QUANT:
                given[node.outputs[0]] = GivenQuant.from_attrs(node.attrs)
            elif node.op == "identity" and source is not None:
                given[node.outputs[0]] = source
            elif node.op == "transpose" and source is not None:
                perm = OPS["transpose"].resolve(node.attrs)["perm"] or list(range(constants[node.inputs[0]].ndim))[::-1]
                given[node.outputs[0]] = source.transposed(perm)
        else:
            nodes.append(node)
    return remove_dead_code(replace(graph, nodes=nodes, constants=constants, given=given))


def _renamed(nodes: list[Node], old: str, new: str) -> list[Node]:
    """The nodes with tensor `old` called `new` wherever it is read or written."""
    def swap(names: list[str]) -> list[str]:
        return [new if name == old else name for name in names]

    return [replace(node, inputs=swap(node.inputs), outputs=swap(node.outputs)) for node in nodes]


def remove_identities(graph: Graph) -> Graph:
    """Drop identity nodes, letting readers read the source tensor directly.

    When the identity's output is a graph output, the source is renamed to it
    instead; an identity from a graph input straight to a graph output stays,
    since both names are the graph's interface.
    """
    interface = {spec.name for spec in graph.inputs} | set(graph.outputs)
    kept: set[str] = set()  # identities between two interface names
    while True:
        node = next((n for n in graph.nodes if n.op == "identity" and n.name not in kept), None)
        if node is None:
            return graph
        source, target = node.inputs[0], node.outputs[0]
        others = [n for n in graph.nodes if n is not node]
        if target not in graph.outputs:
            graph = replace(graph, nodes=_renamed(others, target, source))
        elif source not in interface:
            constants = {target if k == source else k: v for k, v in graph.constants.items()}
            given = {target if k == source else k: v for k, v in graph.given.items()}
            graph = replace(graph, nodes=_renamed(others, source, target), constants=constants, given=given)
        else:
            kept.add(node.name)


def _sole_reader(graph: Graph, readers: dict[str, list[Node]], tensor: str) -> Node | None:
    """The one node reading `tensor`, if exactly one does (once) and the tensor is not a graph output."""
    found = readers.get(tensor, [])
    if len(found) == 1 and tensor not in graph.outputs and found[0].inputs.count(tensor) == 1:
        return found[0]
    return None


def _fresh(graph: Graph, constants: dict[str, np.ndarray], base: str) -> str:
    """A constant name no tensor of the graph (or of `constants`) has."""
    taken = set(constants) | {spec.name for spec in graph.inputs}
    taken |= {name for node in graph.nodes for name in node.outputs}
    return unique_name(base, taken)


def _fuse_into(graph: Graph, rewrite: Callable[[Node, Node, dict[str, np.ndarray]], Node | None]) -> Graph:
    """Merge each node with the sole reader of its output where `rewrite(node, reader, constants)` says how.

    `rewrite` returns the merged node (writing the reader's outputs), adding any
    new constants to the dict it is given, or None to leave the pair alone.
    """
    readers = graph.consumers()
    constants = dict(graph.constants)
    merged: dict[str, Node] = {}  # reader name -> node replacing the pair, emitted where the reader was
    absorbed: set[str] = set()
    for node in graph.nodes:
        reader = _sole_reader(graph, readers, node.outputs[0]) if len(node.outputs) == 1 else None
        if reader is None or node.name in merged or reader.name in merged:
            continue
        fused = rewrite(node, reader, constants)
        if fused is not None:
            merged[reader.name] = fused
            absorbed.add(node.name)
    nodes = [merged.get(node.name, node) for node in graph.nodes if node.name not in absorbed]
    return remove_dead_code(replace(graph, nodes=nodes, constants=constants))


def canonicalize_dense(graph: Graph) -> Graph:
    """Rewrite `matmul(x, W)` with a 2-D constant W (in, out) into a `dense` node (fuse_bias adds the bias)."""
    nodes = [
        Node(node.name, "dense", list(node.inputs), list(node.outputs), {"activation": "none"})
        if node.op == "matmul" and node.inputs[1] in graph.constants and graph.constants[node.inputs[1]].ndim == 2
        else node
        for node in graph.nodes
    ]
    return replace(graph, nodes=nodes)


def _channel_vector(array: np.ndarray, rank: int, axis: int, channels: int) -> np.ndarray | None:
    """`array` as a (channels,) vector if broadcasting it against a rank-`rank` tensor varies it only along `axis`."""
    if array.ndim > rank:
        return None
    padded = (1,) * (rank - array.ndim) + array.shape
    if any(size != 1 for a, size in enumerate(padded) if a != axis) or padded[axis] not in (1, channels):
        return None
    return np.broadcast_to(array.reshape(-1), (channels,))


def _bias_and_axis(node: Node, constants: dict[str, np.ndarray]) -> tuple[np.ndarray, int] | None:
    """(current bias, channel axis) of a conv/dense without activation and with constant weights."""
    if node.op not in WEIGHTED or node.attrs.get("activation", "none") != "none":
        return None
    if any(name not in constants for name in node.inputs[1:]):
        return None
    weight = constants[node.inputs[1]]
    channels = weight.shape[0] if node.op == "conv" else weight.shape[1]
    bias = constants[node.inputs[2]] if len(node.inputs) == 3 else np.zeros(channels, np.float32)
    return bias, (1 if node.op == "conv" else -1)


def fuse_bias(graph: Graph) -> Graph:
    """Fold `y + c` / `c + y` / `y - c` into the bias of the conv/dense writing y, when c is per-channel.

    A dense's output rank is not known from its weight, so its bias must vary
    along the last axis only and may not raise the rank of y.
    """
    shapes = graph.tensor_shapes()

    def rewrite(node: Node, reader: Node, constants: dict[str, np.ndarray]) -> Node | None:
        found = _bias_and_axis(node, constants)
        if found is None or reader.op not in ("add", "sub"):
            return None
        bias, axis = found
        position = reader.inputs.index(node.outputs[0])
        other = reader.inputs[1 - position]
        if other not in constants or (reader.op == "sub" and position != 0):
            return None
        rank = len(shapes[node.outputs[0]].shape)
        vector = _channel_vector(constants[other], rank, axis % rank, bias.shape[0])
        if vector is None:
            return None
        name = _fresh(graph, constants, f"{node.name}.bias")
        constants[name] = (bias + vector if reader.op == "add" else bias - vector).astype(np.float32)
        return replace(node, inputs=[*node.inputs[:2], name], outputs=list(reader.outputs))

    return _fuse_into(graph, rewrite)


def fold_batch_norm(graph: Graph) -> Graph:
    """Fold a batch_norm into the conv/dense it alone follows: scale the weights, shift the bias.

    For a dense, batch_norm's channel axis 1 must be the dense's feature axis,
    so only a 2-D dense output qualifies. A batch_norm anywhere else stays.
    """
    shapes = graph.tensor_shapes()

    def rewrite(node: Node, reader: Node, constants: dict[str, np.ndarray]) -> Node | None:
        found = _bias_and_axis(node, constants)
        if found is None or reader.op != "batch_norm" or any(name not in constants for name in reader.inputs[1:]):
            return None
        if node.op == "dense" and len(shapes[node.outputs[0]].shape) != 2:
            return None
        bias = found[0]
        epsilon = OPS["batch_norm"].resolve(reader.attrs)["epsilon"]
        norm_scale, norm_bias, mean, var = (constants[name] for name in reader.inputs[1:])
        multiplier, offset = batch_norm_affine(norm_scale, norm_bias, mean, var, epsilon)
        weight = constants[node.inputs[1]]
        scale = multiplier.reshape(-1, *[1] * (weight.ndim - 1)) if node.op == "conv" else multiplier
        weight_name = _fresh(graph, constants, f"{node.name}.weight")
        constants[weight_name] = (weight * scale).astype(np.float32)
        bias_name = _fresh(graph, constants, f"{node.name}.bias")
        constants[bias_name] = (bias * multiplier + offset).astype(np.float32)
        return replace(node, inputs=[node.inputs[0], weight_name, bias_name], outputs=list(reader.outputs))

    return _fuse_into(graph, rewrite)


def fold_scale(graph: Graph) -> Graph:
    """Fold `y * c` / `c * y` into the weights and bias of the conv/dense writing y, when c is per-channel.

    BN-Inception (the onnx package's inception_v2) spells each batch norm as a Mul and an Add after the
    conv: left as nodes, they and the relu after them (which could not fuse) took 12 of its 88 ms. The
    Add then folds into the bias (fuse_bias), the relu into the conv (fuse_activations), as a batch_norm's
    fold does.
    """
    shapes = graph.tensor_shapes()

    def rewrite(node: Node, reader: Node, constants: dict[str, np.ndarray]) -> Node | None:
        found = _bias_and_axis(node, constants)
        if found is None or reader.op != "mul":
            return None
        bias, axis = found
        other = reader.inputs[1 - reader.inputs.index(node.outputs[0])]
        if other not in constants:
            return None
        rank = len(shapes[node.outputs[0]].shape)
        multiplier = _channel_vector(constants[other], rank, axis % rank, bias.shape[0])
        if multiplier is None:
            return None
        weight = constants[node.inputs[1]]
        scale = multiplier.reshape(-1, *[1] * (weight.ndim - 1)) if node.op == "conv" else multiplier
        weight_name = _fresh(graph, constants, f"{node.name}.weight")
        constants[weight_name] = (weight * scale).astype(np.float32)
        bias_name = _fresh(graph, constants, f"{node.name}.bias")
        constants[bias_name] = (bias * multiplier).astype(np.float32)
        return replace(node, inputs=[node.inputs[0], weight_name, bias_name], outputs=list(reader.outputs))

    return _fuse_into(graph, rewrite)


def fuse_activations(graph: Graph) -> Graph:
    """Fold an activation op that alone reads a conv/dense output into that node's `activation`."""

    def rewrite(node: Node, reader: Node, constants: dict[str, np.ndarray]) -> Node | None:
        if node.op not in WEIGHTED or node.attrs.get("activation", "none") != "none":
            return None
        if not isinstance(OPS[reader.op], Activation):
            return None
        attrs = {**node.attrs, "activation": reader.op, "activation_attrs": dict(reader.attrs)}
        return replace(node, outputs=list(reader.outputs), attrs=attrs)

    return _fuse_into(graph, rewrite)


PASSES: tuple[Callable[[Graph], Graph], ...] = (
    fold_constants,
    remove_identities,
    canonicalize_dense,
    fuse_bias,
    fold_batch_norm,
    fold_scale,
    fuse_activations,
    remove_dead_code,
)


def optimize(graph: Graph) -> Graph:
    """The canonical pipeline run after tracing: check, then every pass in turn until none changes anything."""
    check_shapes(graph)
    while True:
        before = json.dumps(graph.to_json(), sort_keys=True)
        for rewrite in PASSES:
            graph = rewrite(graph)
        if json.dumps(graph.to_json(), sort_keys=True) == before:
            break
    check_shapes(graph)
    check_given(graph.nodes)
    return graph
