"""dabuild's graph IR: typed inputs, a topologically ordered node list, and constant weights.

A graph lives on disk as `graph.json` (structure, sorted keys) plus `weights.npz`
(constants). Both are byte-stable, so the cache can key on file hashes; the
`content_hash` goes further and ignores how tensors and nodes happen to be named.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dabuild.errors import BuildError
from dabuild.ir.given_quant import GivenQuant
from dabuild.ir.npz import read_npz, write_npz
from dabuild.ir.ops import OPS, ShapeError

FORMAT = "dabuild-graph"
FORMAT_VERSION = 1
GRAPH_FILE = "graph.json"
WEIGHTS_FILE = "weights.npz"


@dataclass
class TensorSpec:
    name: str
    shape: tuple[int | None, ...]  # None = dynamic dimension (the batch)
    dtype: str = "float32"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TensorSpec:
        return cls(data["name"], tuple(data["shape"]), data.get("dtype", "float32"))


@dataclass
class Node:
    name: str
    op: str  # key in dabuild.ir.ops.OPS
    inputs: list[str]  # graph inputs, constants, or outputs of earlier nodes
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)  # JSON-able values only

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "op": self.op,
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "attrs": self.attrs,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Node:
        return cls(data["name"], data["op"], list(data["inputs"]), list(data["outputs"]), data["attrs"])


@dataclass
class Graph:
    inputs: list[TensorSpec]
    outputs: list[str]
    nodes: list[Node]  # topologically ordered
    constants: dict[str, np.ndarray]
    given: dict[str, GivenQuant] = field(default_factory=dict)  # constant -> its upstream quantization (ir/given_quant.py)

    # ------------------------------------------------------------ structure

    def producers(self) -> dict[str, Node]:
        """Tensor name -> the node that writes it."""
        return {out: node for node in self.nodes for out in node.outputs}

    def integer_inputs(self) -> list[str]:
        """The graph inputs of an integer element type: token ids, which only index embedding tables."""
        return [spec.name for spec in self.inputs if np.dtype(spec.dtype).kind in "iu"]

    def stored_inputs(self) -> dict[str, tuple[float, int, str]]:
        """The graph inputs a fake_quant of one scale reads (a quantized model's own input quantization, e.g. a
        .tflite file's int8 input): name -> (scale, zero point, the numpy type its integers are stored in).
        Data of exactly that type are those integers, which `load_inputs` turns into the real values they stand
        for; data of any other type are real values."""
        names = {spec.name for spec in self.inputs}
        stored = {}
        for node in self.nodes:
            if node.op != "fake_quant" or node.inputs[0] not in names or len(node.attrs["scale"]) != 1:
                continue
            given = GivenQuant.from_attrs(node.attrs)
            if given.bits <= 16 and not given.blocked:
                storage = f"{'' if given.signed else 'u'}int{8 if given.bits <= 8 else 16}"
                stored[node.inputs[0]] = (given.scale[0], given.zero_point[0], storage)
        return stored

    def consumers(self) -> dict[str, list[Node]]:
        """Tensor name -> the nodes that read it, in graph order."""
        readers: dict[str, list[Node]] = {}
        for node in self.nodes:
            for name in node.inputs:
                readers.setdefault(name, []).append(node)
        return readers

    def tensor_shapes(self) -> dict[str, TensorSpec]:
        """Spec of every tensor (inputs, constants, node outputs), checking each node on the way.

        Raises BuildError naming the node when an op is unknown, a tensor is read
        before it is written, a name is written twice, or shapes do not fit.
        """
        specs: dict[str, TensorSpec] = {spec.name: spec for spec in self.inputs}
        for name, array in self.constants.items():
            if name in specs:
                raise BuildError(f"graph: constant {name!r} has the name of a graph input")
            specs[name] = TensorSpec(name, tuple(array.shape), str(array.dtype))
        for node in self.nodes:
            where = f"graph node {node.name!r} ({node.op})"
            op = OPS.get(node.op)
            if op is None:
                raise BuildError(f"{where}: unknown op; known ops: {', '.join(sorted(OPS))}")
            missing = [name for name in node.inputs if name not in specs]
            if missing:
                raise BuildError(f"{where}: reads {', '.join(map(repr, missing))} before anything writes it")
            try:
                op.check_arity(len(node.inputs))
                inferred = op.infer([specs[name] for name in node.inputs], node.attrs)
            except ShapeError as error:
                raise BuildError(f"{where}: {error}") from None
            if len(inferred) != len(node.outputs):
                raise BuildError(f"{where}: has {len(node.outputs)} outputs, the op makes {len(inferred)}")
            for name, (shape, dtype) in zip(node.outputs, inferred):
                if name in specs:
                    raise BuildError(f"{where}: writes {name!r}, which is already defined")
                specs[name] = TensorSpec(name, tuple(shape), dtype)
        unknown = [name for name in self.outputs if name not in specs]
        if unknown:
            raise BuildError(f"graph outputs {', '.join(map(repr, unknown))} are never written")
        return specs

    # ------------------------------------------------------------ files

    def to_json(self) -> dict[str, Any]:
        given = {"given": {name: quant.to_json() for name, quant in sorted(self.given.items())}} if self.given else {}
        return {
            **given,
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "inputs": [spec.to_json() for spec in self.inputs],
            "outputs": list(self.outputs),
            "nodes": [node.to_json() for node in self.nodes],
            "constants": {
                name: {"shape": list(array.shape), "dtype": str(array.dtype)}
                for name, array in self.constants.items()
            },
        }

    def save(self, directory: Path) -> None:
        """Write graph.json and weights.npz into `directory`; equal graphs give equal bytes."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        text = json.dumps(self.to_json(), sort_keys=True, indent=2) + "\n"
        (directory / GRAPH_FILE).write_text(text, encoding="utf-8")
        write_npz(directory / WEIGHTS_FILE, self.constants)

    @classmethod
    def load(cls, directory: Path) -> Graph:
        """Read a graph written by `save`; BuildError naming the file if it is missing or malformed."""
        directory = Path(directory)
        graph_file, weights_file = directory / GRAPH_FILE, directory / WEIGHTS_FILE
        try:
            data = json.loads(graph_file.read_text(encoding="utf-8"))
            constants = read_npz(weights_file, mapped=True)
        except (OSError, ValueError) as error:
            raise BuildError(f"{directory}: cannot read graph: {error}") from None
        if data.get("format") != FORMAT or data.get("version") != FORMAT_VERSION:
            raise BuildError(
                f"{graph_file}: not a {FORMAT} version {FORMAT_VERSION} file "
                f"(format {data.get('format')!r}, version {data.get('version')!r})"
            )
        if set(data["constants"]) != set(constants):
            raise BuildError(f"{weights_file}: arrays do not match the constants listed in {graph_file}")
        return cls(
            inputs=[TensorSpec.from_json(spec) for spec in data["inputs"]],
            outputs=list(data["outputs"]),
            nodes=[Node.from_json(node) for node in data["nodes"]],
            constants={name: constants[name] for name in data["constants"]},
            given={name: GivenQuant.from_attrs(attrs) for name, attrs in data.get("given", {}).items()},
        )

    # ------------------------------------------------------------ identity

    def content_hash(self) -> str:
        """sha256 of the graph's meaning: structure, shapes, attrs and weight bytes.

        Node names, constant names and intermediate/output tensor names are replaced
        by their position (constants by first use), so retracing the same model
        under other names hashes the same. Graph input names are kept: feeds are
        matched to inputs by name, so they are part of the interface.
        """
        canonical: dict[str, str] = {spec.name: spec.name for spec in self.inputs}
        constants: list[dict[str, Any]] = []
        nodes: list[dict[str, Any]] = []

        def rename(name: str) -> str:
            if name not in canonical and name in self.constants:
                array = np.ascontiguousarray(self.constants[name])
                canonical[name] = f"c{len(constants)}"
                constants.append(
                    {
                        "dtype": str(array.dtype),
                        "shape": list(array.shape),
                        "sha256": hashlib.sha256(array.tobytes()).hexdigest(),
                    }
                )
            return canonical.get(name, f"?{name}")  # an undefined name stays visible

        for index, node in enumerate(self.nodes):
            inputs = [rename(name) for name in node.inputs]
            for position, name in enumerate(node.outputs):
                canonical[name] = f"t{index}.{position}"
            nodes.append({"op": node.op, "inputs": inputs, "outputs": len(node.outputs), "attrs": node.attrs})
        form = {
            "inputs": [[spec.name, list(spec.shape), spec.dtype] for spec in self.inputs],
            "nodes": nodes,
            "constants": constants,
            "outputs": [rename(name) for name in self.outputs],
        }
        if self.given:  # absent from graphs without given quantization, so their hashes stay as they were
            form["given"] = sorted([rename(name), quant.to_json()] for name, quant in self.given.items())
        text = json.dumps(form, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    def summary(self) -> str:
        """One line for logs, e.g. `3 nodes (dense x3), 6 constants, inputs x[None, 64]`."""
        counts: dict[str, int] = {}
        for node in self.nodes:
            counts[node.op] = counts.get(node.op, 0) + 1
        ops = ", ".join(f"{op} x{n}" for op, n in counts.items())
        inputs = ", ".join(f"{spec.name}{list(spec.shape)}" for spec in self.inputs)
        return f"{len(self.nodes)} nodes ({ops}), {len(self.constants)} constants, inputs {inputs}"
