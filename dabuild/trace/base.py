"""Frontend plumbing: the tracer plugin base, framework choice, model loading, the trace stage.

A frontend (tracer plugin) turns one framework's model into a dabuild Graph.
Plugins register in the `dabuild.tracers` entry-point group, built-ins included.
Which plugin traces a model:

1. the framework the recipe names, if any;
2. for a file (str or Path), the plugin that lists the file's suffix in `suffixes`;
3. the plugin named like the top-level package of the model's type
   (`type(model).__module__.split('.')[0]`, e.g. "torch");
4. "numpy" for any other callable: a plain function or callable object whose
   type does not come from a known ML framework is taken to compute with numpy.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import sys
import traceback
from abc import ABC, abstractmethod
from dataclasses import dataclass
from itertools import count
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from dabuild import plugins
from dabuild.errors import BuildError, UsageError
from dabuild.ir.graph import Graph
from dabuild.ir.npz import read_npz
from dabuild.ir.passes import optimize
from dabuild.limits import is_numeric, npz_headers
from dabuild.progress import Progress
from dabuild.registry import Registry

Shape = tuple["int | None", ...]

# Packages whose models need their own tracer: without one installed, tracing them
# as numpy would only fail later and more confusingly.
KNOWN_FRAMEWORKS = frozenset(
    {"torch", "tensorflow", "keras", "jax", "flax", "onnx", "onnxruntime", "qkeras", "hls4ml", "brevitas", "sklearn"}
)
_PACKAGE_DIR = Path(__file__).resolve().parent.parent


class TracerPlugin(ABC):
    """Base of every frontend, in the spirit of da4ml's DAIS tracer plugins.

    `inputs` are the declared example shapes by input name. The leading axis of
    every input is the batch: graphs keep it dynamic (None), whatever size the
    recipe declared for the example.
    """

    suffixes: ClassVar[tuple[str, ...]] = ()  # model file suffixes this plugin reads, e.g. (".onnx",)
    weights_suffixes: ClassVar[tuple[str, ...]] = ()  # weight files it loads into a factory's model, e.g. (".pt",)
    progress: Progress = Progress.silent()  # trace_model sets the caller's; plugins report through it
    dtypes: dict[str, str] = {}  # model.inputs' element types by input name (trace_model sets them); float32 if absent

    def __init__(self, model: Any, inputs: dict[str, Shape] | None = None):
        self.model = model
        self.inputs = None if inputs is None else {name: tuple(shape) for name, shape in inputs.items()}

    def get_input_shapes(self) -> dict[str, Shape]:
        """Input shapes by name with a dynamic batch axis; UsageError if the model does not say them."""
        if not self.inputs:
            raise UsageError(
                f"the {type(self).__name__} frontend needs the input shapes: set model.inputs in the recipe, "
                "e.g. inputs: {x: [1, 64]}"
            )
        return {name: (None, *shape[1:]) if shape else () for name, shape in self.inputs.items()}

    @classmethod
    def side_files(cls, model_file: Path) -> list[Path]:
        """The files reading `model_file` opens besides it (ONNX external data), read from the model file itself
        without loading it: they enter the trace stage's key, so changing one traces again."""
        return []

    @classmethod
    def build_with_weights(cls, factory: Any, path: Path, where: str) -> Any:
        """The model `factory` (named `where`) builds with the weights file `path` (a `weights_suffixes` file)."""
        raise NotImplementedError(f"{cls.__name__} lists weights_suffixes but does not override build_with_weights")

    @classmethod
    def converters(cls) -> Registry[Any] | None:
        """This frontend's converter table (source op name -> a converter whose `emits` names the IR ops it may
        make), which docs/ops.md reads; None: it converts by running the model, not op by op (numpy)."""
        return None

    @abstractmethod
    def apply_model(self, inputs: dict[str, Any]) -> Any:
        """Run the model on this frontend's symbolic tensors and return its symbolic outputs."""

    @abstractmethod
    def trace(self) -> Graph:
        """The model as a (not yet optimised) Graph."""


def _tracer_classes() -> dict[str, type[TracerPlugin]]:
    return {name: plugins.load(plugins.TRACERS, name) for name in plugins.available(plugins.TRACERS)}


def choose_framework(model: Any) -> str:
    """The tracer name for `model` when the recipe names none (rules in the module docstring)."""
    installed = plugins.available(plugins.TRACERS)
    if isinstance(model, (str, Path)):
        suffix = Path(model).suffix
        for name, cls in _tracer_classes().items():
            if suffix in cls.suffixes:
                return name
        raise UsageError(
            f"{model}: no installed frontend reads {suffix or 'suffix-less'} files; "
            f"installed frameworks: {', '.join(installed) or 'none'}"
        )
    root = type(model).__module__.split(".")[0]
    keras, torch = sys.modules.get("keras"), sys.modules.get("torch")  # a model means its framework is imported
    if keras is not None and isinstance(model, keras.Model):
        root = "keras"  # before torch: on keras's torch backend a keras.Model is also a torch.nn.Module
    elif torch is not None and isinstance(model, torch.nn.Module):
        root = "torch"  # also user subclasses, whose module is the user's
    if root in installed:
        return root
    if callable(model) and root not in KNOWN_FRAMEWORKS:
        return "numpy"
    raise UsageError(plugins.unknown_name_message(plugins.TRACERS, root))


def trace_model(
    model: Any,
    framework: str | None = None,
    inputs: dict[str, Shape] | None = None,
    progress: Progress | None = None,
    dtypes: dict[str, str] | None = None,
) -> Graph:
    """Trace `model` with the named frontend (or the one `choose_framework` picks); the raw Graph."""
    name = framework or choose_framework(model)
    tracer = plugins.load(plugins.TRACERS, name)(model, inputs)
    if progress is not None:
        tracer.progress = progress
    tracer.dtypes = dict(dtypes or {})
    graph = tracer.trace()
    check_integer_inputs(graph, tracer.dtypes)
    return graph


def declared_inputs(inputs: dict[str, Any] | None) -> tuple[dict[str, Shape] | None, dict[str, str]]:
    """model.inputs as shapes by name and the element types it declares (entries {shape, dtype})."""
    if inputs is None:
        return None, {}
    shapes: dict[str, Shape] = {}
    dtypes: dict[str, str] = {}  # only the inputs that are not float32
    for name, entry in inputs.items():
        if isinstance(entry, (list, tuple)):
            shapes[name] = tuple(entry)
            continue
        fields = entry if isinstance(entry, dict) else {"shape": entry.shape, "dtype": entry.dtype}  # recipe's
        shapes[name] = tuple(fields["shape"])
        if fields.get("dtype", "float32") != "float32":
            dtypes[name] = fields["dtype"]
    return shapes, dtypes


def check_integer_inputs(graph: Graph, declared: dict[str, str]) -> None:
    """UsageError unless every integer graph input only indexes embedding tables (a Gather of a constant table,
    torch's nn.Embedding), and the element types model.inputs declares are the graph's."""
    for spec in graph.inputs:
        want = declared.get(spec.name, spec.dtype)
        if (np.dtype(want).kind == "f") != (np.dtype(spec.dtype).kind == "f"):
            raise UsageError(f"model.inputs declares input {spec.name!r} as {want}, but the model takes {spec.dtype}")
    integer = {spec.name: spec.dtype for spec in graph.inputs if np.dtype(spec.dtype).kind in "iu"}
    for node in graph.nodes:
        read = [name for position, name in enumerate(node.inputs)
                if name in integer and (node.op, position) != ("embedding", 0)]
        if read:
            raise UsageError(f"node {node.name!r} ({node.op}) reads the integer input {read[0]!r} "
                             f"({integer[read[0]]}); an integer input may only index an embedding table (a Gather "
                             "of a constant table, nn.Embedding) or feed shape computations, which loading evaluates")
    unread = [name for name in integer if name in graph.outputs]
    if unread:
        raise UsageError(f"graph output {unread[0]!r} is the integer input itself")


def python_imports(path: Path) -> list[Path]:
    """The modules of `path`'s own folder that the Python file imports, and the ones they import, found by reading
    their source (not by running it): a model's .py file that imports `layers.py` beside it is traced again when
    `layers.py` changes. Packages installed elsewhere are keyed by their versions, not here."""
    import ast

    found: list[Path] = []
    pending = [path]
    while pending:
        current = pending.pop()
        try:
            tree = ast.parse(current.read_bytes(), filename=str(current))
        except (OSError, SyntaxError, ValueError):  # importing it reports what is wrong
            continue
        for module in _imported_names(tree):
            base = current.parent if module.level else path.parent
            for _ in range(max(module.level - 1, 0)):
                base = base.parent
            for candidate in _module_files(base, module.dotted):
                if candidate not in found and candidate != path:
                    found.append(candidate)
                    pending.append(candidate)
    return sorted(found)


@dataclass(frozen=True)
class _ImportedName:
    dotted: str  # `a.b` for `import a.b`, `from a import b` (b may be a module) or `from . import b` with level 1
    level: int   # leading dots of a relative import


def _imported_names(tree: Any) -> list[_ImportedName]:
    import ast

    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [_ImportedName(alias.name, 0) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            prefix = f"{node.module}." if node.module else ""
            if node.module:
                names.append(_ImportedName(node.module, node.level))
            names += [_ImportedName(prefix + alias.name, node.level) for alias in node.names if alias.name != "*"]
    return names


def _module_files(base: Path, dotted: str) -> list[Path]:
    """The files of `base` that importing `dotted` from it executes (each package's __init__.py on the way)."""
    files = []
    folder = base
    for part in dotted.split("."):
        if (folder / f"{part}.py").is_file():
            files.append(folder / f"{part}.py")
            break
        folder = folder / part
        if not (folder / "__init__.py").is_file():
            break
        files.append(folder / "__init__.py")
    return files


def user_location(tb: traceback.StackSummary) -> str:
    """`file:line` of the innermost frame in user code (not dabuild, numpy or the stdlib)."""
    skipped = (str(_PACKAGE_DIR), str(Path(functools.__file__).parent))
    for frame in reversed(tb):
        installed = "site-packages" in frame.filename or "dist-packages" in frame.filename
        if not frame.filename.startswith(skipped) and not installed and not frame.filename.startswith("<"):
            return f"{frame.filename}:{frame.lineno}"
    return "<model>"


# ---------------------------------------------------------------- loading


_module_numbers = count()


def _import_file(path: Path) -> Any:
    """Import a .py file under a fresh module name, its folder on sys.path only meanwhile."""
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    module_name = f"_dabuild_model_{path.stem}_{digest}_{next(_module_numbers)}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise UsageError(f"{path}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look modules up here
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        del sys.modules[module_name]
        where = user_location(traceback.extract_tb(error.__traceback__))
        raise BuildError(f"{where}: importing {path} failed: {type(error).__name__}: {error}") from error
    finally:
        sys.path.remove(str(path.parent))
    return module


def _resolve_attr(owner: Any, dotted: str, where: str) -> Any:
    value = owner
    for part in dotted.split("."):
        if not hasattr(value, part):
            raise UsageError(f"{where} has no attribute {dotted!r}")
        value = getattr(value, part)
    return value


def load_model(source: str, weights: Path | None) -> Any:
    """The model object a recipe's `model.source` names.

    `file.py:attr` (the path taken as written: a loaded recipe's is absolute) or `package.module:attr`; a source
    without `:` naming an existing file is returned as a Path, for frontends that
    read model files. With `weights`, `attr` is a factory: for an .npz it is
    called with the dict of arrays; a file a frontend lists in its
    `weights_suffixes` (torch's .pt) goes to that frontend's `build_with_weights`.
    Either way the result is the model.
    """
    if ":" not in source:
        path = Path(source)
        if path.is_file():
            return path
        raise UsageError(f"model source {source!r} must be 'file.py:attr', 'package.module:attr' or a model file")
    location, attr = source.rsplit(":", 1)
    if location.endswith(".py"):
        path = Path(location).resolve()
        if not path.is_file():
            raise UsageError(f"model file {path} does not exist (model source {source!r})")
        module, where = _import_file(path), str(path)
    else:
        try:
            module = importlib.import_module(location)
        except ImportError as error:
            raise UsageError(f"cannot import model module {location!r}: {error}") from None
        where = f"module {location!r}"
    model = _resolve_attr(module, attr, where)
    if weights is None:
        return model
    weights_path = Path(weights)
    if not weights_path.is_file():
        raise UsageError(f"model weights file {weights_path} does not exist")
    if weights_path.suffix != ".npz":
        loader = _weights_loader(weights_path.suffix)
        if loader is not None:
            return loader.build_with_weights(model, weights_path, f"{where}:{attr}")
    for name, (_, descr) in npz_headers(weights_path).items():  # sizes, archive ratio: limits.py
        if not is_numeric(descr):
            raise UsageError(f"{weights_path}: array {name!r} has dtype {descr}; weights are numbers (object "
                             "arrays are never read: they would be unpickled)")
    try:
        arrays = read_npz(weights_path)
    except (OSError, ValueError) as error:
        raise UsageError(f"{weights_path}: not a readable .npz file: {error}") from None
    if not callable(model):
        raise UsageError(f"{where}: {attr!r} must be a factory taking the weights dict, got {type(model).__name__}")
    try:
        return model(arrays)
    except Exception as error:
        location = user_location(traceback.extract_tb(error.__traceback__))
        raise BuildError(
            f"{location}: {attr}(weights from {weights_path.name}) raised {type(error).__name__}: {error}"
        ) from error


def _weights_loader(suffix: str) -> type[TracerPlugin] | None:
    """The frontend that loads weight files of this suffix, if one does."""
    return next((cls for cls in _tracer_classes().values() if suffix in cls.weights_suffixes), None)


_WEIGHTED_OPS = ("dense", "conv", "conv_transpose", "matmul", "batch_norm", "embedding")


def refuse_non_finite(graph: Graph, source: Any) -> None:
    """UsageError naming the model file and each weight holding NaN (any constant) or Inf (the weights and
    biases of weighted ops: elsewhere an infinite constant may be meant, as a clip bound or an attention
    mask): calibration would otherwise report a NaN range of some activation, far from its cause."""
    weights = {name for node in graph.nodes if node.op in _WEIGHTED_OPS for name in node.inputs[1:]}
    bad = []
    for name, array in graph.constants.items():
        if array.dtype.kind != "f":
            continue
        count = int(np.isnan(array).sum()) + (int(np.isinf(array).sum()) if name in weights else 0)
        if count:
            bad.append(f"{name!r} ({count} of {array.size})")
    if bad:
        raise UsageError(f"{source}: NaN or infinite weights in {', '.join(bad[:10])}"
                         + (f" and {len(bad) - 10} more" if len(bad) > 10 else ""))


def trace_stage(model_spec: Any, out_dir: Path, progress: Progress) -> None:
    """Load, trace and canonicalise the recipe's model; write graph.json + weights.npz to `out_dir`.

    `model_spec` needs attributes framework, source, weights and inputs (the
    recipe's ModelSpec has them).
    """
    model = load_model(model_spec.source, model_spec.weights)
    inputs, dtypes = declared_inputs(model_spec.inputs)
    graph = optimize(trace_model(model, model_spec.framework, inputs, progress, dtypes))
    refuse_non_finite(graph, model_spec.weights or model_spec.source)
    graph.save(Path(out_dir))
    progress.info(f"traced {model_spec.source}: {graph.summary()}")
