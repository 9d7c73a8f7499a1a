"""Importing keras on its torch backend, and turning what a recipe names into a `keras.Model`."""

from __future__ import annotations

import importlib.util
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from dabuild.errors import BuildError, UsageError
from dabuild.limits import check_zip_members
from dabuild.trace.base import user_location


def import_keras() -> Any:
    """keras, on the torch backend unless KERAS_BACKEND already names another; UsageError if it is missing."""
    os.environ.setdefault("KERAS_BACKEND", "torch")
    stderr, sys.stderr = sys.stderr, sys.__stderr__  # absl's log handler (keras imports it) keeps the stream it
    try:                                              # sees; a stage's captured stderr is gone by exit, when it closes
        import keras
    except ImportError as error:
        raise UsageError(f"the keras frontend needs keras 3 ({error}): pip install 'dabuild[keras]'") from None
    finally:
        sys.stderr = stderr
    if not keras.__version__.startswith("3."):
        raise UsageError(f"the keras frontend reads Keras 3 models; keras {keras.__version__} is installed")
    return keras


def _register_layer_packages() -> None:
    """Import the packages whose quantized layers .keras files may name (hgq2), where installed."""
    if importlib.util.find_spec("hgq") is not None:
        import hgq  # noqa: F401  (registers HGQ2's layers and quantizers with keras)


def load_file(path: Path) -> Any:
    """A `.keras` file as a model (not compiled: only inference is traced)."""
    keras = import_keras()
    _register_layer_packages()
    if not path.is_file():
        raise UsageError(f"{path}: no such model file")
    _check_archive(path)
    try:  # safe_mode (keras's default, stated): no Lambda bytecode, no classes outside keras's registry
        return keras.saving.load_model(path, compile=False, safe_mode=True)
    except Exception as error:  # noqa: BLE001 - keras reports bad archives and unknown classes in many exception types
        qkeras = qkeras_layers(path)
        if qkeras:
            raise UsageError(
                f"{path}: a QKeras model (layers {', '.join(qkeras)}); QKeras needs TensorFlow (package "
                "'tensorflow', with 'qkeras'), which dabuild's keras frontend does not use (it runs Keras 3 on torch) "
                "and which is not installed; rebuild the model with HGQ2's QKeras-style quantizers (q_type 'kbi': "
                "keep_negative, bits, integer), or export it to QONNX with qonnx's QKeras converter (it needs "
                "TensorFlow) and build the .onnx file") from None
        raise UsageError(f"{path}: keras cannot load this model: {type(error).__name__}: {error}") from None


QKERAS_NAMES = ("QDense", "QConv1D", "QConv2D", "QDepthwiseConv2D", "QSeparableConv2D", "QActivation",
                "QBatchNormalization", "QAveragePooling2D", "QSimpleRNN", "QLSTM", "QGRU", "quantized_bits",
                "quantized_relu", "quantized_po2", "quantized_tanh", "binary", "ternary")


def _check_archive(path: Path) -> None:
    """A .keras archive's members within the limits (limits.py) before keras or the QKeras check inflates
    one: a config.json that inflates to gigabytes is refused here, naming the member and its size."""
    import zipfile

    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as archive:
                check_zip_members(archive, path)
        except (OSError, zipfile.BadZipFile):
            return  # not an archive after all: keras's own message says what it is


def qkeras_layers(path: Path) -> list[str]:
    """The QKeras classes the saved model's configuration names (a .keras archive's config.json, an .h5 file's
    model_config); none where it names a package of its own for them (HGQ2's QDense is not QKeras's)."""
    import json
    import zipfile

    text = ""
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                text = archive.read("config.json").decode()
        else:
            import h5py

            with h5py.File(path, "r") as h5:
                config = h5.attrs.get("model_config", "")
                text = config.decode() if isinstance(config, bytes) else str(config)
    except (OSError, KeyError, ValueError, ImportError, zipfile.BadZipFile):  # not a model file: keras's message says so
        return []
    found: list[str] = []

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            name, module = node.get("class_name"), str(node.get("module") or "")
            if name in QKERAS_NAMES and (module.startswith("qkeras") or not module) and name not in found:
                found.append(name)
            for value in node.values():
                visit(value)
        elif isinstance(node, list):
            for value in node:
                visit(value)

    try:
        visit(json.loads(text))
    except ValueError:
        return []
    return found


def _call_factory(factory: Any, where: str) -> Any:
    try:
        return factory()
    except Exception as error:
        location = user_location(traceback.extract_tb(error.__traceback__))
        raise BuildError(f"{location}: {where}() raised {type(error).__name__}: {error}") from error


def as_model(model: Any) -> Any:
    """The keras.Model that `model` is, names (a .keras path) or builds (a factory taking no arguments)."""
    keras = import_keras()
    if isinstance(model, (str, Path)):
        return load_file(Path(model))
    if isinstance(model, keras.Model):
        return model
    if callable(model):
        built = _call_factory(model, getattr(model, "__qualname__", repr(model)))
        if isinstance(built, keras.Model):
            return built
        raise UsageError(f"the keras frontend's model factory {model!r} returned a {type(built).__name__}, "
                         "not a keras.Model")
    raise UsageError(f"the keras frontend reads keras.Model objects, .keras files or factories, "
                     f"not a {type(model).__name__}")


def build_with_weights(factory: Any, path: Path, where: str) -> Any:
    """The model `factory` builds, with the weights of `path` (written by `model.save_weights`) loaded."""
    model = as_model(factory)
    try:
        model.load_weights(path)
    except Exception as error:  # noqa: BLE001 - keras raises many types for weights that do not fit
        raise UsageError(f"{path}: cannot load these weights into the model {where} builds: "
                         f"{type(error).__name__}: {error}") from None
    return model
