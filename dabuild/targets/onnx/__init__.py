"""The onnx target: the quantized graph as a QDQ ONNX model, proven by running it in onnxruntime.

The artifact is one file, model.onnx (see `qdq` for its form). It takes the
float input and returns the float output, quantizing inside, so `check`
compares it with dabuild's fake-quant reference (`run_quantized`) at the
`approximate` level: onnxruntime's float requantization rounds differently
from the integer reference's fixed point by at most a step here and there,
and where that drifts further through a deep net, check proves the samples
that disagree layer by layer on onnxruntime's own values (`trace`).

onnx and onnxruntime are an extra (`pip install dabuild[onnx]`); they are
imported only when the target exports, runs or traces, so recipes without
this target never need them.
"""

from __future__ import annotations

import importlib
import shlex
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import numpy as np
from pydantic import Field

from dabuild.capability import CapabilitySpec, QuantChoices
from dabuild.errors import BuildError
from dabuild.installed import installed_version
from dabuild.ir.kernels.compiling import available_cores
from dabuild.qir.dtypes import int_type, is_int_type
from dabuild.qir.qgraph import QGraph
from dabuild.targets.base import Target, held
from dabuild.targets.onnx.isa import Isa, detect, resolve, saturates

MODEL_FILE = "model.onnx"
PACKAGES = ("onnx", "onnxruntime")
NARROW_WEIGHT = "int7"  # within +-64: a pair of products by uint8 activations cannot leave int16
GATHERED = frozenset({"embedding"})  # weights onnxruntime gathers, never multiplies


def missing_package_error(package: str) -> BuildError:
    return BuildError(f"the onnx target needs the Python package {package!r}, which is not installed; "
                      "install it with `pip install dabuild[onnx]`")


def _import(module: str) -> ModuleType:
    """Import a module of this package that needs onnx or onnxruntime; BuildError saying how to get them."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        if error.name in PACKAGES or error.name is None:
            raise missing_package_error(error.name or " or ".join(PACKAGES)) from error
        raise


class OnnxTarget(Target):
    kind: ClassVar[str] = "onnx"
    capability: ClassVar[str] = "onnxruntime"
    default_tolerance = "approximate"
    packages: ClassVar[tuple[str, ...]] = PACKAGES
    reference: ClassVar[str] = "fake_quant"
    run_batch: ClassVar[int | None] = 32  # onnxruntime/tract hold ~17 MB per ResNet-50 sample
    size_options: ClassVar[tuple[str, ...]] = ("opset", "isa")

    class Options(Target.Options):
        opset: int | None = Field(default=None, ge=17, le=21,
                                  description="ONNX opset of the model; default 17 (onnxruntime >= 1.13 runs it), "
                                  "21 where weights have 4 bits or fewer (stored as INT4; onnxruntime >= 1.20).")
        threads: int = Field(default=1, ge=1, description="onnxruntime intra-op threads when checking.")
        isa: Isa = Field(default="auto", description=(
            "The instruction set the artifact will run on (auto: this machine's). On x86-64 without VNNI "
            "(avx2, avx512, x86-64) onnxruntime's u8s8 kernels sum pairs of products into a saturating int16: "
            "there the tuner offers 7-bit weights first (exact in u8s8) and wider weights are written as uint8 "
            "(exact in u8u8, slower)."))

    @property
    def isa(self) -> str:
        """The instruction set the artifact is written for: the option, `auto` resolved to this machine's."""
        return resolve(self.options.isa)

    options: Options

    @classmethod
    def layer_types(cls) -> frozenset[str]:
        return held(_import("dabuild.targets.onnx.qdq").WRITERS)

    @classmethod
    def float_ops(cls) -> frozenset[str]:
        """What the float exporter spells, where the QDQ writer takes float layers (it writes islands with it)."""
        return held(_import("dabuild.targets.onnx_float").EXPORTERS) if "float" in cls.layer_types() else frozenset()

    @classmethod
    def capability_for(cls, capability: CapabilitySpec, options: dict[str, Any]) -> CapabilitySpec:
        """Where onnxruntime's u8s8 kernels saturate (the option's isa), every weight choice wider than 7 bits
        offers int7 first: exact in u8s8 at its full speed, at an accuracy the search measures; the wider types
        stay on offer (exported as uint8, exact and slower) for a config that needs them."""
        capability = super().capability_for(capability, options)
        if not saturates(resolve(cls.Options.model_validate(options).isa)):
            return capability

        def seven_bits_first(choices: QuantChoices | None) -> QuantChoices | None:
            if choices is None or not any(int_type(name).signed and int_type(name).bits > 7
                                          for name in choices.dtype if is_int_type(name)):
                return choices
            return choices.model_copy(update={"dtype": [NARROW_WEIGHT, *(d for d in choices.dtype if d != NARROW_WEIGHT)]})

        ops = {op: entry if op in GATHERED else entry.model_copy(update={"weight": seven_bits_first(entry.weight)})
               for op, entry in capability.ops.items()}
        return capability.model_copy(update={"ops": ops})

    def runtime_version(self) -> dict[str, str]:
        # The artifact's isa, and this machine's: where they differ in saturation the check runs precise.
        return {**{package: installed_version(package) for package in PACKAGES}, "isa": self.isa, "host isa": detect()}

    @property
    def precise(self) -> bool:
        """Whether this machine's u8s8 kernels saturate where the artifact's isa does not (an artifact written for
        a CPU with VNNI, checked here): then onnxruntime runs it in its x64 precision mode, as that CPU computes."""
        return saturates(detect()) and not saturates(self.isa)

    def not_run(self) -> list[str]:
        if not self.precise:
            return []
        return [(f"onnxruntime's default kernels as a {self.isa} CPU runs them: this one ({detect()}, no VNNI) "
                 "would saturate their int8 weights, so the artifact ran in onnxruntime's x64 precision mode "
                 "(int8 weights as uint8, exact, as VNNI computes)")]

    def export_tools(self) -> dict[str, str]:
        """The instruction set the model is written for (which weights are uint8 depends on it)."""
        return {"isa": self.isa}

    def export(self, qgraph: QGraph, out_dir: Path) -> None:
        qdq = _import("dabuild.targets.onnx.qdq")
        model = qdq.to_qdq_onnx(qgraph, self.options.opset, isa=self.isa)
        (Path(out_dir) / MODEL_FILE).write_bytes(model.SerializeToString())

    def stored_bytes(self, qgraph: QGraph) -> int:
        """The model's initializers as stored: int8 weights a byte each, INT4 ones two a byte, int32 biases, float32
        scales and float islands' constants."""
        return int(_import("dabuild.targets.onnx.qdq").stored_bytes(qgraph, self.options.opset, self.isa))

    def __init__(self, options: Target.Options | None = None, capability: CapabilitySpec | None = None):
        super().__init__(options, capability)
        self._sessions: dict[str, tuple[tuple[str, int, int], Any, dict[str, str] | None]] = {}

    def _session(self, purpose: str, artifact_dir: Path) -> tuple[Any, dict[str, str] | None]:
        """The onnxruntime session for `purpose` ("run" the model, or "trace" its every quantized tensor) and the
        tensors it returns (QGraph tensor -> the model's output; None: the model's own outputs), built once per
        artifact and kept while this target lives: check runs the artifact batch after batch, and its proof traces
        it a few samples at a time, so loading, shape inference and session setup of a 100 MB model happen once,
        not per batch."""
        runner = _import("dabuild.targets.onnx.runner")
        path = Path(artifact_dir) / MODEL_FILE
        try:
            status = path.stat()
        except OSError as error:
            raise BuildError(f"onnxruntime could not run {path}: {error.strerror}") from error
        key = (str(path.resolve()), status.st_mtime_ns, status.st_size)
        if purpose in self._sessions and self._sessions[purpose][0] == key:
            return self._sessions[purpose][1:]
        self._sessions.pop(purpose, None)  # the old session goes before the new one is built
        model, outputs = (str(path), None) if purpose == "run" else self._traced_model(path)
        try:
            session = runner.session(model, self.options.threads, self.precise)
        except Exception as error:  # onnxruntime raises its own exception types for bad models
            raise BuildError(f"onnxruntime could not run {path}: {error}") from error
        self._sessions[purpose] = (key, session, outputs)
        return session, outputs

    @staticmethod
    def _traced_model(path: Path) -> tuple[bytes, dict[str, str]]:
        """A copy of the model with every quantized tensor's integers as an extra output, and which output shows
        which QGraph tensor (the model's own output shows its output tensor as it returns it)."""
        onnx = _import("onnx")
        qdq = _import("dabuild.targets.onnx.qdq")
        model = onnx.load(str(path))
        output = model.graph.output[0].name  # the QGraph's output tensor, dequantized
        tensors = {tensor: output if tensor == output else name for tensor, name in qdq.quantized_tensors(model).items()}
        inferred = {info.name: info for info in onnx.shape_inference.infer_shapes(model).graph.value_info}
        model.graph.output.extend(inferred[name] for name in tensors.values() if name != output)
        return model.SerializeToString(), tensors

    def _run(self, purpose: str, artifact_dir: Path,
             inputs: np.ndarray) -> tuple[list[np.ndarray], dict[str, str] | None]:
        """The purpose's session run on `inputs`, and which QGraph tensor each output shows (see `_session`)."""
        session, outputs = self._session(purpose, artifact_dir)
        runner = _import("dabuild.targets.onnx.runner")
        try:
            return runner.run_session(session, inputs, None if outputs is None else list(outputs.values())), outputs
        except Exception as error:  # onnxruntime raises its own exception types for bad models and inputs
            raise BuildError(f"onnxruntime could not run {Path(artifact_dir) / MODEL_FILE}: {error}") from error

    def run(self, artifact_dir: Path, inputs: np.ndarray, work_dir: Path) -> np.ndarray:
        """The model's outputs on `inputs`, consecutive slices of them run at once on one session, as many as
        this machine's cores hold sessions of `threads` threads: onnxruntime computes each sample alone (its
        convs image by image, its integer GEMMs exactly, its float GEMMs row by row), so the slices change no
        bit, and the slices of one check batch together hold its memory."""
        parts = max(1, min(len(inputs), available_cores() // self.options.threads))
        if parts == 1:
            return self._run("run", artifact_dir, inputs)[0][0]
        self._session("run", artifact_dir)  # built once, before the threads share it (onnxruntime's Run is safe)
        bounds = np.linspace(0, len(inputs), parts + 1).astype(int)
        with ThreadPoolExecutor(parts, thread_name_prefix="dabuild-onnx-check") as pool:
            outputs = pool.map(lambda index: self._run("run", artifact_dir, inputs[bounds[index]:bounds[index + 1]])[0][0],
                               range(parts))
            return np.concatenate(list(outputs))

    def trace(self, artifact_dir: Path, inputs: np.ndarray, work_dir: Path) -> dict[str, np.ndarray]:
        """The integers of every quantized tensor, read as extra outputs of a copy of the model, and the
        model's output as it returns it (real values: its dequantization is part of what is traced).

        Tensors that are graph outputs are not fused away, so onnxruntime runs this copy with its
        QuantizeLinear nodes in place: the values are those of the unfused QDQ path.
        """
        values, tensors = self._run("trace", artifact_dir, inputs)
        assert tensors is not None
        return dict(zip(tensors, values))

    def rerun_script(self, artifact_dir: Path, inputs_file: str, outputs_file: str) -> str:
        model = f"{Path(artifact_dir).name}/{MODEL_FILE}"
        command = ["-m", "dabuild.targets.onnx.runner", model, inputs_file, outputs_file,
                   "--threads", str(self.options.threads), *(["--precise"] if self.precise else [])]
        return '"${PYTHON:-python3}" ' + shlex.join(command) + "\n"
