"""The tflite target: the quantized graph as an int8 (or 16x8) .tflite flatbuffer, proven in TFLite Micro.

The artifact is model.tflite (written by `export.to_tflite` through TFLite's own generated schema, no
TensorFlow) and model.json (its input and output, and where each QGraph tensor lies in the file, for `trace`). It takes the quantized input and returns the quantized
output, as TFLM firmware does, so `check` compares it with dabuild's integer reference at `exact`: the
reference runs the QGraph as TFLM computes the file (`integers.as_tflm`: float32 scales, the multipliers TFLM
derives from them, TFLite's pool and mean forms) with the target's rounding, `tflm` unless the recipe says
otherwise (the capability's default).

`run` runs the file in TFLM's Python interpreter (the tflite-micro package: TFLM's reference kernels) and, with
option `litert` (the default), in LiteRT with its reference kernels too, and fails where LiteRT lies more than a
step from TFLM (its mean and int16 add round otherwise, on the committed .tflite files as on dabuild's); the
check report counts LiteRT's outputs a step off and gives the arena TFLM used (`tflm_arena_bytes`, from its recording
allocator) and the file's size, so a user knows both before flashing.

tflite-micro and ai-edge-litert are the `tflite` extra, imported only when the target exports or runs.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from dabuild.errors import BuildError, UsageError
from dabuild.installed import installed_version
from dabuild.qir.fixed_point import Rounding
from dabuild.qir.qgraph import QGraph
from dabuild.registry import import_extra
from dabuild.targets.base import Target, held, refuse_ops_without_integers
from dabuild.targets.tflite.writers import BUILTINS, WRITERS

MODEL_FILE = "model.tflite"
MANIFEST = "model.json"
PACKAGES = ("tflite-micro", "ai-edge-litert")
WEIGHTED = ("conv", "dense", "conv_transpose")   # ops whose lowering adds a lookup for a fused table activation
LITERT_STEPS = 1   # how far LiteRT's reference kernels may round from TFLM's (see `run`)


def _module(name: str) -> Any:
    return import_extra(f"dabuild.targets.tflite.{name}", "tflite", "the tflite target")


def node_layers(graph: Any, node: Any, layers: Collection[str]) -> set[str]:
    """The layer types of a lowering's `layers` that `node` makes without float islands: a conv's or dense's
    lookup only under a fused table activation, and a lookup named by its function where TFLite has no builtin
    for it ("lookup (gelu)"); a blocked dense only of a given blocked weight; a conv TFLite has no operator for
    named by what it is ("conv (2 groups)", "conv (3-D)"; a 1-D conv is a 2-D one of unit height)."""
    from dabuild.qir.activations import is_table_activation

    made = set(layers) - {"float_weighted", "float"}
    function = node.attrs.get("activation", "none")
    if "lookup" in made and node.op in WEIGHTED and not is_table_activation(function):
        made.discard("lookup")
    elif "lookup" in made and node.op in WEIGHTED and function not in BUILTINS:
        made = (made - {"lookup"}) | {f"lookup ({function})"}
    made = set(TfliteTarget.op_layers(node.op, frozenset(made)))
    given = graph.given.get(node.inputs[1]) if len(node.inputs) > 1 else None
    if given is None or not given.blocked:
        made.discard("blocked_dense")
    weight = graph.constants.get(node.inputs[1]) if node.op in ("conv", "conv_transpose") else None
    if weight is not None and weight.ndim != 4 and (node.op, weight.ndim) != ("conv", 3):
        made = (made - {node.op}) | {f"{node.op} ({weight.ndim - 2}-D)"}
    elif weight is not None and node.attrs.get("groups", 1) != 1 and (node.op == "conv_transpose" or weight.shape[1] != 1):
        made = (made - {node.op}) | {f"{node.op} ({node.attrs['groups']} groups)"}
    return made


class TfliteTarget(Target):
    kind: ClassVar[str] = "tflite"
    capability: ClassVar[str] = "tflite"
    default_tolerance = "exact"
    packages: ClassVar[tuple[str, ...]] = PACKAGES
    run_batch: ClassVar[int | None] = 256
    size_options: ClassVar[tuple[str, ...]] = ("float_io",)

    class Options(Target.Options):
        rounding: Rounding | None = None   # how requantization rounds; None: the capability's (tflm)
        litert: bool = True                # also run the file in LiteRT's reference kernels (within a step of TFLM)
        float_io: bool = False             # the file takes and returns float32 (QUANTIZE/DEQUANTIZE at its edges)

    options: Options

    def __init__(self, options: Target.Options | None = None, capability: Any = None):
        super().__init__(options, capability)
        self.litert: dict[str, int] = {}   # LiteRT against TFLM over this target's `run` calls: samples, values, differing

    @property
    def rounding(self) -> str:
        return self.options.rounding or self.capability_spec.rounding or "dabuild"

    @classmethod
    def layer_types(cls) -> frozenset[str]:
        return held(WRITERS)

    @classmethod
    def op_layers(cls, op: str, layers: frozenset[str]) -> frozenset[str]:
        """A table activation's lookup is written for sigmoid, tanh and hard_swish only (LOGISTIC, TANH,
        HARD_SWISH); any other's needs "lookup (<op>)", which no writer holds."""
        from dabuild.qir.activations import is_table_activation

        if "lookup" in layers and is_table_activation(op) and op not in BUILTINS:
            return (layers - {"lookup"}) | {f"lookup ({op})"}
        return layers

    def refuse(self, graph: Any, integer_forms: Mapping[str, frozenset[str]]) -> None:
        """Every op whose integer layers the target cannot write, by node, before calibration (no float
        islands: TFLM runs the whole model in integers)."""
        try:
            refuse_ops_without_integers(graph, self.kind, self.layer_types(), integer_forms, needed=lambda node, layers:
                                        node_layers(graph, node, layers))
        except BuildError as error:
            raise UsageError(str(error)) from None

    def integer_graph(self, qgraph: QGraph) -> QGraph:
        return _module("integers").as_tflm(qgraph, self.rounding)

    def runtime_version(self) -> dict[str, str]:
        return {package: installed_version(package) for package in PACKAGES if package != "ai-edge-litert"
                or self.options.litert}

    def not_run(self) -> list[str]:
        if not self.options.litert:
            return ["LiteRT (option litert: false): the file ran in TFLite Micro only"]
        try:
            import ai_edge_litert  # noqa: F401
        except ImportError:
            return ["LiteRT (the ai-edge-litert package is not installed): the file ran in TFLite Micro only"]
        return []

    def stored_bytes(self, qgraph: QGraph) -> int:
        """The file's size: weights, biases, scales and the flatbuffer's tables."""
        return len(_module("export").to_tflite(self.integer_graph(qgraph), self.options.float_io).data)

    def export(self, qgraph: QGraph, out_dir: Path) -> None:
        written = _module("export").to_tflite(qgraph, self.options.float_io)
        out_dir = Path(out_dir)
        (out_dir / MODEL_FILE).write_bytes(written.data)
        manifest = {"input_shape": list(qgraph.tensors[qgraph.input].shape), "input_dtype": qgraph.input_params.storage,
                    "output_shape": list(qgraph.tensors[qgraph.output].shape),
                    "output_dtype": qgraph.output_params.storage, "rounding": qgraph.rounding,
                    "model_bytes": len(written.data), "tensors": written.tensors,
                    "float_io": self.options.float_io,
                    "input_params": [qgraph.input_params.scale, qgraph.input_params.zero_point],
                    "output_params": [qgraph.output_params.scale, qgraph.output_params.zero_point]}
        (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")

    def run(self, artifact_dir: Path, inputs: np.ndarray, work_dir: Path) -> np.ndarray:
        """TFLM's outputs; with option litert, LiteRT's too, which must lie within one step of TFLM's (LiteRT's
        reference kernels for mean and int16 add round otherwise than TFLM's, by a step at most; the committed
        .tflite files show the same in both runtimes), counted for the report."""
        runtime = _module("runtime")
        path = Path(artifact_dir) / MODEL_FILE
        manifest = json.loads((Path(artifact_dir) / MANIFEST).read_text())
        feed = runtime.file_inputs(manifest, inputs)
        outputs = runtime.quantized_outputs(manifest, runtime.run_tflm(path, feed))
        if not self.not_run():
            steps = np.abs(runtime.quantized_outputs(manifest, runtime.run_litert(path, feed)).reshape(outputs.shape)
                           - outputs.astype(np.int64))
            if steps.size and steps.max() > LITERT_STEPS:
                raise BuildError(f"{path}: LiteRT's reference kernels and TFLite Micro differ by up to "
                                 f"{int(steps.max())} steps on {int(np.sum(steps > 0))} of {outputs.size} output values")
            self.litert = {key: self.litert.get(key, 0) + value for key, value in (
                ("samples", len(inputs)), ("values", outputs.size), ("differing", int(np.sum(steps > 0))))}
        return outputs.reshape(len(inputs), *manifest["output_shape"]).astype(manifest["output_dtype"])

    def measurements(self, artifact_dir: Path, inputs: np.ndarray, work_dir: Path) -> dict[str, Any]:
        """The arena TFLM used on the first sample (its recording allocator's total), the file's size, and how
        many of LiteRT's output values lay a step from TFLM's."""
        path = Path(artifact_dir) / MODEL_FILE
        versions = self.runtime_version()
        ran = [f"TFLite Micro {versions['tflite-micro']} (reference kernels)"]
        ran += [f"LiteRT {versions['ai-edge-litert']} (reference kernels)"] if self.litert else []
        measured: dict[str, Any] = {"model_bytes": path.stat().st_size, "ran_in": " and ".join(ran)}
        if len(inputs):
            manifest = json.loads((Path(artifact_dir) / MANIFEST).read_text())
            runtime = _module("runtime")
            arena = runtime.arena_bytes(path, runtime.file_inputs(manifest, inputs[:1])[0])
            measured["tflm_arena_bytes"] = arena if arena is not None else "not reported"
        if self.litert:
            measured["litert_outputs_one_step_from_tflm"] = f"{self.litert['differing']} of {self.litert['values']}"
        return {"firmware": measured}

    def trace(self, artifact_dir: Path, inputs: np.ndarray, work_dir: Path) -> dict[str, np.ndarray]:
        """Every QGraph tensor the file holds, from TFLM with every tensor kept (model.json's "tensors": file
        tensor and layout), in the QGraph's own axis order."""
        tensors = json.loads((Path(artifact_dir) / MANIFEST).read_text())["tensors"]
        found = _module("runtime").tflm_tensors(Path(artifact_dir) / MODEL_FILE, inputs,
                                                {name: int(index) for name, (index, _) in tensors.items()})
        unlaid = {"nhwc": lambda values: values.transpose(0, 3, 1, 2) if values.ndim == 4 else values,
                  "n1wc": lambda values: values[:, 0].transpose(0, 2, 1)}
        return {name: unlaid.get(tensors[name][1], lambda values: values)(values) for name, values in found.items()}

    def rerun_script(self, artifact_dir: Path, inputs_file: str, outputs_file: str) -> str:
        name = Path(artifact_dir).name
        return ('"${PYTHON:-python3}" -m dabuild.targets.tflite.runtime '
                f"{name}/{MODEL_FILE} {inputs_file} {outputs_file}\n")
