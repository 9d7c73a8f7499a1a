"""Reading an .onnx file into plain Python: nodes with decoded attributes, initializers as arrays.

Everything that touches protobuf lives here, so the converters see only
dataclasses, numpy arrays and Python scalars. A file that cannot be read,
parsed or validated fails here with a UsageError naming it: whatever is wrong
with the file is the user's to fix, and no later stage should see half a model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import external_data_helper, numpy_helper

from dabuild.errors import UsageError
from dabuild.limits import max_nodes

OLDEST_OPSET = 9
_DEFAULT_DOMAINS = ("", "ai.onnx")


@dataclass
class OnnxNode:
    """One ONNX node; `label` names it in messages (ONNX node names are optional)."""

    label: str
    op_type: str
    domain: str
    inputs: list[str]  # "" marks an omitted optional input
    outputs: list[str]
    attrs: dict[str, Any]
    proto: onnx.NodeProto = field(repr=False)

    @property
    def kind(self) -> str:
        """`Conv`, or `com.microsoft.FusedConv` outside the default domain."""
        return self.op_type if self.domain in _DEFAULT_DOMAINS else f"{self.domain}.{self.op_type}"


@dataclass
class GraphInput:
    name: str
    dims: tuple[int | str | None, ...] | None  # int fixed, str a dim_param, None unnamed unknown; None = unknown rank
    dtype: np.dtype | None


@dataclass
class OnnxModel:
    where: str  # the file, or a description of an in-memory model, for messages
    opset: int
    inputs: list[GraphInput]  # run-time inputs only (initializers removed)
    outputs: list[str]
    initializers: dict[str, np.ndarray]
    nodes: list[OnnxNode]


def read_model_file(path: Path) -> onnx.ModelProto:
    """Parse and validate `path`; UsageError naming the file when it is missing, corrupt or not ONNX, holds more
    nodes than the limit, or keeps external data anywhere but beside it."""
    if not path.is_file():
        raise UsageError(f"{path}: ONNX model file does not exist")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError, OSError) as error:
        raise UsageError(f"{path}: not a readable ONNX model (corrupt, truncated or another format): {error}") from None
    check_node_count(model, path)
    check_external_data(model, path)
    try:
        onnx.external_data_helper.load_external_data_for_model(model, str(path.parent))
    except (ValueError, RuntimeError, OSError) as error:
        raise UsageError(f"{path}: cannot read its external data: {error}") from None
    check_model(model, str(path))
    return model


def _graphs(graph: onnx.GraphProto) -> list[onnx.GraphProto]:
    """`graph` and every subgraph (If, Loop, Scan bodies) inside it."""
    found = [graph]
    for node in graph.node:
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                found += _graphs(sub)
    return found


def check_node_count(model: onnx.ModelProto, path: Path) -> None:
    """UsageError if the graph (with its subgraphs) holds more nodes than DABUILD_MAX_NODES, before any work."""
    count, limit = sum(len(graph.node) for graph in _graphs(model.graph)), max_nodes()
    if count > limit:
        raise UsageError(f"{path}: the graph holds {count:,} nodes, over the limit of {limit:,} "
                         "(DABUILD_MAX_NODES); refused before tracing")


def check_external_data(model: onnx.ModelProto, path: Path) -> None:
    """Every tensor kept outside the .onnx file must name a regular file inside the model's folder, reached
    without a symbolic link: a relative `../`, an absolute path or a link would let a model read any file
    of the machine into its weights. UsageError naming the model, the tensor and the location."""
    folder = path.parent.resolve()
    for tensor in external_data_helper._get_all_tensors(model):
        if not external_data_helper.uses_external_data(tensor):
            continue
        location = next((entry.value for entry in tensor.external_data if entry.key == "location"), "")
        problem = None
        if not location:
            problem = "is empty"
        elif Path(location).is_absolute() or Path(location).drive:
            problem = "is an absolute path"
        elif ".." in Path(location).parts:
            problem = "leaves the model's folder (../)"
        elif any((folder / Path(*Path(location).parts[:n])).is_symlink() for n in range(1, len(Path(location).parts) + 1)):
            problem = "is reached through a symbolic link"
        elif not (folder / location).is_file():
            problem = "is not a file in the model's folder"
        if problem:
            raise UsageError(f"{path}: tensor {tensor.name!r} keeps its data in {location!r}, which {problem}; "
                             "external data must be a file beside the model, in its folder")


def external_data_locations(path: Path) -> list[str]:
    """The `location`s of the external data files `path`'s tensors name, as written (relative to its folder).

    Read from the protobuf alone (no tensor data is loaded): the trace stage keys on these files, so a model whose
    weights live in `model.onnx.data` is traced again when they change. An unreadable file names none here; reading
    it for the trace reports what is wrong.
    """
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError, OSError):
        return []
    locations = {entry.value for tensor in external_data_helper._get_all_tensors(model)  # subgraphs' too
                 if external_data_helper.uses_external_data(tensor)
                 for entry in tensor.external_data if entry.key == "location"}
    return sorted(locations)


def graph_inputs(path: Path) -> list[tuple[str, tuple[int | str | None, ...], str]] | None:
    """The run-time inputs of an .onnx file (name, dims, element type), read without loading weights: what
    `dabuild validate` checks the data against. None when the file cannot be read or leaves a rank unknown
    (tracing reports it)."""
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError, OSError):
        return None
    initializers = {tensor.name for tensor in model.graph.initializer}
    found = []
    for info in model.graph.input:
        if info.name in initializers:
            continue
        dims, dtype = _dims(info), _dtype(info)
        if dims is None or dtype is None:
            return None
        found.append((info.name, dims, str(dtype)))
    return found


def check_model(model: onnx.ModelProto, where: str) -> None:
    """Reject what protobuf parses but ONNX does not accept (e.g. a text file that happens to decode)."""
    if not model.HasField("graph") or not model.graph.output:
        raise UsageError(f"{where}: not an ONNX model (no graph with outputs; corrupt, truncated or another format)")
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UsageError(f"{where}: invalid ONNX model: {first}") from None


def _imported_opset(model: onnx.ModelProto, where: str) -> int:
    versions = [entry.version for entry in model.opset_import if entry.domain in _DEFAULT_DOMAINS]
    if not versions:
        raise UsageError(f"{where}: the model imports no ai.onnx opset")
    return max(versions)


def default_opset(model: onnx.ModelProto, where: str) -> int:
    """The model's ai.onnx opset, which must lie between OLDEST_OPSET and what the installed onnx knows."""
    opset, newest = _imported_opset(model, where), onnx.defs.onnx_opset_version()
    if not OLDEST_OPSET <= opset <= newest:
        raise UsageError(
            f"{where}: opset {opset} is outside what dabuild reads ({OLDEST_OPSET} to {newest}, "
            f"the newest the installed onnx {onnx.__version__} knows)"
        )
    return opset


def upgrade(model: onnx.ModelProto, where: str) -> tuple[onnx.ModelProto, str | None]:
    """A model below OLDEST_OPSET rewritten by onnx's version converter, and the note saying so (None if
    the model was recent enough). Files from 2017-2019 exporters (opsets 1 to 8) load this way."""
    opset = _imported_opset(model, where)
    if opset >= OLDEST_OPSET:
        return model, None
    from onnx import version_converter

    try:
        upgraded = version_converter.convert_version(model, OLDEST_OPSET)
        onnx.checker.check_model(upgraded)
    except Exception as error:  # noqa: BLE001 - the converter's C++ adapters raise RuntimeError and others
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UsageError(
            f"{where}: opset {opset} is older than {OLDEST_OPSET}, and onnx {onnx.__version__}'s version "
            f"converter cannot upgrade it: {first}"
        ) from None
    return upgraded, f"{where}: opset {opset} upgraded to {OLDEST_OPSET} with onnx's version converter"


def _attribute(attr: onnx.AttributeProto) -> Any:
    value = onnx.helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, list):
        return [item.decode("utf-8", errors="replace") if isinstance(item, bytes) else item for item in value]
    return value


def _dims(value_info: onnx.ValueInfoProto) -> tuple[int | str | None, ...] | None:
    tensor_type = value_info.type.tensor_type
    if not tensor_type.HasField("shape"):
        return None
    dims: list[int | str | None] = []
    for dim in tensor_type.shape.dim:
        if dim.HasField("dim_value") and dim.dim_value > 0:
            dims.append(dim.dim_value)
        else:  # dim_param, 0 or nothing: a size only known when running
            dims.append(dim.dim_param or None)
    return tuple(dims)


def _dtype(value_info: onnx.ValueInfoProto) -> np.dtype | None:
    elem_type = value_info.type.tensor_type.elem_type
    if not elem_type:
        return None
    return onnx.helper.tensor_dtype_to_np_dtype(elem_type)


_SCOPES, _CLASSES = "pkg.torch.onnx.name_scopes", "pkg.torch.onnx.class_hierarchy"
_LONGEST_SCOPES = 10_000  # characters of a scope list read; longer ones are ignored (the file is untrusted)


def module_path(proto: onnx.NodeProto) -> str | None:
    """The torch module path (`features.0`) torch.onnx's exporter records for the node, the name the torch frontend
    gives the same node (an nn.Sequential's numbered child prefixed with its class: `conv2d_0`); None without one
    (other exporters, or a node torch made outside any module)."""
    import ast

    props = {entry.key: entry.value for entry in proto.metadata_props if entry.key in (_SCOPES, _CLASSES)}
    try:
        scopes = ast.literal_eval(props[_SCOPES]) if len(props.get(_SCOPES, "")) <= _LONGEST_SCOPES else []
        classes = ast.literal_eval(props[_CLASSES]) if len(props.get(_CLASSES, "")) <= _LONGEST_SCOPES else []
    except (KeyError, ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if not isinstance(scopes, list) or len(scopes) < 3 or not isinstance(scopes[-2], str) or not scopes[-2]:
        return None  # [root '', ..., module path, op]: a node of the root module has none
    path = scopes[-2]
    if path[0].isdigit():
        kind = classes[-2] if isinstance(classes, list) and len(classes) >= 2 and isinstance(classes[-2], str) else ""
        return f"{kind.rsplit('.', 1)[-1].lower() or 'module'}_{path}"
    return path


def decode(model: onnx.ModelProto, where: str) -> OnnxModel:
    """The model as plain data; each initializer is converted to numpy exactly once."""
    opset = default_opset(model, where)
    graph = model.graph
    initializers = {tensor.name: numpy_helper.to_array(tensor) for tensor in graph.initializer}
    bad = [f"{name!r} ({int(np.isnan(array).sum())} of {array.size})"
           for name, array in initializers.items() if array.dtype.kind == "f" and np.isnan(array).any()]
    if bad:  # infinities may be meant (clip bounds, masks); trace/base.py refuses them in weights
        raise UsageError(f"{where}: NaN values in initializer{'s' * (len(bad) > 1)} {', '.join(bad[:10])}")
    labels: set[str] = set()
    nodes = []
    for index, proto in enumerate(graph.node):
        label = module_path(proto) or proto.name or f"{proto.op_type}_{index}"
        while label in labels:
            label = f"{label}_{index}"
        labels.add(label)
        attrs = {attr.name: _attribute(attr) for attr in proto.attribute}
        nodes.append(
            OnnxNode(label, proto.op_type, proto.domain, list(proto.input), list(proto.output), attrs, proto)
        )
    inputs = [
        GraphInput(info.name, _dims(info), _dtype(info)) for info in graph.input if info.name not in initializers
    ]
    return OnnxModel(where, opset, inputs, [info.name for info in graph.output], initializers, nodes)
