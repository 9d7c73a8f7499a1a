"""Graph-to-graph rewrites that bring a freshly traced graph into canonical form.

Frontends spell a fully connected layer many ways (matmul + add, add with the
bias first, a separate relu). Later stages handle one spelling only: a `dense`
node whose activation is fused. Every pass returns a new Graph and leaves its
argument untouched.
"""

from __future__ import annotations

from dataclasses import replace

from dabuild.ir.graph import Graph, Node, TensorSpec


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
    return replace(graph, nodes=kept[::-1], constants=constants)


def _sole_reader(graph: Graph, tensor: str) -> Node | None:
    """The one node reading `tensor`, if exactly one does and it is not also a graph output."""
    readers = graph.consumers().get(tensor, [])
    if len(readers) == 1 and tensor not in graph.outputs:
        return readers[0]
    return None


def _bias_of(graph: Graph, add: Node, product: str, product_rank: int, out_features: int) -> str | None:
    """The constant that `add` adds to `product`, if it is a bias of `out_features` values.

    A bias of shape (1, ..., out) counts only if it does not raise the rank of the
    product, so storing it as (out,) keeps the result's shape.
    """
    if add.op != "add" or add.inputs.count(product) != 1:
        return None
    other = add.inputs[1 - add.inputs.index(product)]
    array = graph.constants.get(other)
    if array is None or array.size != out_features or array.shape[-1:] != (out_features,):
        return None
    return other if array.ndim <= product_rank else None


def canonicalize_dense(graph: Graph) -> Graph:
    """Rewrite `matmul(x, W)` (+ `add` of a bias constant) into one `dense` node.

    W must be a 2-D constant (in, out); a bias of shape (out,) or (1, out) is
    absorbed and stored as (out,). The add is absorbed only when the matmul
    result feeds nothing else, so no tensor a graph output needs disappears.
    """
    shapes = graph.tensor_shapes()
    constants = dict(graph.constants)
    nodes: list[Node] = []
    absorbed: set[str] = set()
    for node in graph.nodes:
        if node.name in absorbed:
            continue
        weight = node.inputs[1] if node.op == "matmul" else None
        if weight is None or weight not in constants or constants[weight].ndim != 2:
            nodes.append(node)
            continue
        inputs, outputs = [node.inputs[0], weight], node.outputs
        product = node.outputs[0]
        reader = _sole_reader(graph, product)
        bias = None
        if reader is not None:
            bias = _bias_of(graph, reader, product, len(shapes[product].shape), constants[weight].shape[1])
        if reader is not None and bias is not None:
            bias_name = bias if constants[bias].ndim == 1 else f"{bias}.flat"
            constants[bias_name] = constants[bias].reshape(-1)
            inputs, outputs = [*inputs, bias_name], reader.outputs
            absorbed.add(reader.name)
        nodes.append(Node(node.name, "dense", inputs, list(outputs), {"activation": "none"}))
    return remove_dead_code(replace(graph, nodes=nodes, constants=constants))


def fuse_dense_relu(graph: Graph) -> Graph:
    """Fold a `relu` that alone reads a `dense` output into that dense's `activation`."""
    nodes: list[Node] = []
    absorbed: set[str] = set()
    for node in graph.nodes:
        if node.name in absorbed:
            continue
        reader = _sole_reader(graph, node.outputs[0]) if node.op == "dense" else None
        if reader is not None and reader.op == "relu" and node.attrs.get("activation", "none") == "none":
            node = Node(node.name, "dense", node.inputs, list(reader.outputs), {**node.attrs, "activation": "relu"})
            absorbed.add(reader.name)
        nodes.append(node)
    return replace(graph, nodes=nodes)


def optimize(graph: Graph) -> Graph:
    """The canonical pipeline run after tracing: check, prune, canonicalise dense, fuse, check."""
    check_shapes(graph)
    graph = fuse_dense_relu(canonicalize_dense(remove_dead_code(graph)))
    check_shapes(graph)
    return graph

