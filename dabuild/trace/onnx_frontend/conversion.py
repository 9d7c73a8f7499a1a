"""The state of one ONNX -> IR conversion, as the per-op converters see it.

Each ONNX tensor is either *known* (an initializer, a Constant, or computed
from known values while loading: a numpy array) or *run-time* (a graph input
or an IR node output: a TensorSpec). Converters read attributes and known
values, and `emit` IR nodes over run-time tensors; a known value an IR node
reads becomes an IR constant on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from dabuild.errors import BuildError
from dabuild.ir.graph import Node, TensorSpec
from dabuild.ir.ops import OPS, ShapeError
from dabuild.names import unique_name

if TYPE_CHECKING:
    from dabuild.trace.onnx_frontend.model_file import OnnxNode

Shape = tuple["int | None", ...]


def is_partial(value: np.ndarray) -> bool:
    """True for a load-time shape value with unknown (None) elements: the dynamic batch size."""
    return value.dtype == object


class Unsupported(Exception):
    """This node uses something dabuild does not model; reported with every other such node at once."""


class Conversion:
    def __init__(self, where: str, opset: int, taken_names: set[str], labels: frozenset[str] = frozenset()):
        """`taken_names`: every name of the model (no fresh name may be one); `labels`: the node labels that are
        no tensor's name, each of which names the first IR node of its ONNX node as it is (`features.0`, not
        `features.0_1`)."""
        self.where = where
        self.opset = opset
        self.known: dict[str, np.ndarray] = {}
        self.specs: dict[str, TensorSpec] = {}
        self.nodes: list[Node] = []
        self.constants: dict[str, np.ndarray] = {}
        self.quantized: set[str] = set()  # ONNX integer tensors held as their real values (quantized.py)
        self.declared: tuple[str, ...] | None = None  # the IR ops the running converter says it emits
        self.relaxed_batch = False  # the file fixes the batch to 1 and this conversion lets it vary
        self.read: set[str] = set()  # tensors some node or graph output reads (others need no value)
        self._taken = set(taken_names)
        self._labels = set(labels)

    # ------------------------------------------------------------ reading inputs

    def has(self, node: OnnxNode, index: int) -> bool:
        """Whether optional input `index` is given."""
        return index < len(node.inputs) and node.inputs[index] != ""

    def shape(self, name: str) -> Shape:
        if name in self.specs:
            return tuple(self.specs[name].shape)
        return tuple(self.known[name].shape)

    def rank(self, name: str) -> int:
        return len(self.shape(name))

    def static(self, node: OnnxNode, index: int, what: str) -> np.ndarray | None:
        """The load-time value of input `index` (None if omitted); Unsupported if it is only known when running."""
        if not self.has(node, index):
            return None
        name = node.inputs[index]
        if name not in self.known:
            raise Unsupported(f"its {what} ({name!r}) must be known when loading, but is computed at run time")
        value = self.known[name]
        if is_partial(value):
            raise Unsupported(f"its {what} ({name!r}) depends on the dynamic batch size")
        return value

    def required(self, node: OnnxNode, index: int, what: str) -> np.ndarray:
        """The load-time value of input `index`, which the op cannot do without; Unsupported if it is omitted."""
        value = self.static(node, index, what)
        if value is None:
            raise Unsupported(f"its {what} (input {index}) is missing, which {node.op_type} needs")
        return value

    def ints(self, node: OnnxNode, index: int, what: str) -> list[int] | None:
        value = self.static(node, index, what)
        return None if value is None else [int(v) for v in np.ravel(value)]

    def attr_or_input(self, node: OnnxNode, name: str, index: int, since: int) -> list[int] | None:
        """An int list that was an attribute before opset `since` and an input from then on."""
        if self.opset >= since:
            return self.ints(node, index, name)
        value = node.attrs.get(name)
        return None if value is None else [int(v) for v in value]

    # ------------------------------------------------------------ writing

    def bind(self, name: str, value: np.ndarray) -> None:
        """Record a load-time value."""
        self.known[name] = value

    def fresh(self, base: str) -> str:
        """A tensor or node name not used by the model nor by this conversion."""
        return unique_name(base, self._taken)

    def materialize(self, name: str) -> TensorSpec:
        """The spec of a tensor IR nodes can read, turning a known value into an IR constant."""
        if name in self.specs:
            return self.specs[name]
        value = self.known[name]
        if is_partial(value):
            raise Unsupported(f"it computes with {name!r}, which holds the dynamic batch size")
        if value.dtype.kind == "f":
            value = value.astype(np.float32, copy=False)
        self.constants[name] = value
        self.specs[name] = TensorSpec(name, tuple(value.shape), str(value.dtype))
        return self.specs[name]

    def emit(
        self,
        node: OnnxNode,
        op: str,
        inputs: list[str],
        attrs: dict[str, Any] | None = None,
        outputs: list[str] | None = None,
    ) -> list[str]:
        """Append one IR node for (part of) `node`; its output names (fresh ones unless `outputs`)."""
        attrs = attrs or {}
        specs = [self.materialize(name) for name in inputs]
        where = f"{self.where}: node {node.label!r} ({node.kind})"
        if op not in OPS:
            raise BuildError(f"{where}: dabuild's IR has no {op!r} op (known: {', '.join(sorted(OPS))})")
        if self.declared is not None and op not in self.declared:
            raise BuildError(f"{where}: its converter emits {op!r}, which it does not declare in `emits` "
                             f"({', '.join(self.declared) or 'nothing'}); docs/ops.md would be wrong")
        try:
            OPS[op].check_arity(len(specs))
            inferred = OPS[op].infer(specs, attrs)
        except ShapeError as error:
            raise BuildError(f"{where}: {op}: {error}") from None
        if outputs is None:
            outputs = [self.fresh(f"{node.label}/{op}") for _ in inferred]
        elif len(outputs) != len(inferred):
            raise BuildError(f"{where}: {op} makes {len(inferred)} outputs, the node has {len(outputs)}")
        for name, (shape, dtype) in zip(outputs, inferred):
            self.specs[name] = TensorSpec(name, tuple(shape), dtype)
        name = node.label if node.label in self._labels else self.fresh(node.label)
        self._labels.discard(node.label)
        self.nodes.append(Node(name, op, [spec.name for spec in specs], list(outputs), attrs))
        return list(outputs)
