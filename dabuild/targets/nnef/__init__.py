"""The NNEF target: a QGraph as an NNEF model (.nnef.tgz), proven by running it in tract.

The artifact is `model.nnef.tgz` (graph.nnef, graph.quant when used, one
tensor file per variable) and a `model.json` manifest. The model takes and
returns float32 tensors with a symbolic batch axis N; inside, quantization
is expressed two ways (details in `layers`):

- tract's quantized types where tract has integer kernels for them: dense and
  conv with per-tensor int8 weights read QI8 activations and write QI8 outputs
  (graph.quant `zero_point_linear_quantize` entries; conversions by
  `tract_core_cast`). Option `quantized_kernels: false` turns this off.
- float with fake-quant everywhere else (per-channel weights, pools, means,
  add/sub/mul, concat, softmax, fp32-fallback layers): the float op on the
  real values, with dequantized weights, then quantize-dequantize in NNEF
  primitives (div, round, clamp, mul). Lookup tables are gathered
  (`tract_core_gather`), which is exactly their fake-quant.

So tract computes what dabuild's fake-quant reference computes, up to the
rounding of tract's own requantization and float summation order: the
default tolerance is `approximate` (one output quantization step).
"""

from __future__ import annotations

import gzip
import io
import json
import re
import shlex
import tarfile
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from dabuild.errors import BuildError
from dabuild.qir.qgraph import QGraph
from dabuild.targets.base import Target, held
from dabuild.targets.nnef.emitter import Emitter
from dabuild.targets.nnef.float_ops import FLOAT_OPS
from dabuild.targets.nnef.layers import LAYER_EXPORTERS, export_layer
from dabuild.targets.nnef.tensor_file import encode

ARCHIVE = "model.nnef.tgz"
MANIFEST = "model.json"
GRAPH_FILE = "graph.nnef"
QUANT_FILE = "graph.quant"
_SIGNATURE = re.compile(r"^graph (\w+)\((.*)\) -> \((.*)\)$", re.MULTILINE)


def _tract() -> Any:
    try:
        import tract
    except ImportError as error:
        raise BuildError("the nnef target runs its artifact with tract's Python package, which is not installed: "
                         "pip install dabuild[tract]") from error
    return tract


def build_document(qgraph: QGraph, quantized_kernels: bool) -> tuple[Emitter, str, str, dict[str, str]]:
    """The emitter holding the exported graph, the input and output identifiers and, for traces, the
    identifier of every QGraph tensor's real value."""
    qgraph.require_dtypes("nnef", activations=("int8",))  # graph.quant declares 8-bit signed tensors (QI8)
    e = Emitter(qgraph)
    if qgraph.takes_indices:  # token ids: the embeddings' gathers read them as they come
        source = e.external(qgraph.input, qgraph.tensors[qgraph.input].shape, "integer")
        e.set_real(qgraph.input, source)
    else:
        source = e.external(f"{qgraph.input}_float", qgraph.tensors[qgraph.input].shape)
        e.set_real(qgraph.input, e.fake_quant(source, qgraph.input_params, qgraph.input))
    for layer in qgraph.layers:
        export_layer(e, layer, quantized_kernels)
    output = e.real(qgraph.output)
    # Every tensor gets a real form (tract drops the ones no output reads), so a trace can name any of them.
    traced = {name: e.real(name) for name in qgraph.tensors
              if name not in qgraph.constants and not (name == qgraph.input and qgraph.takes_indices)}
    return e, source, output, traced


def _archive(files: dict[str, bytes]) -> bytes:
    """A byte-stable .tgz (sorted members, no times or owners), so equal exports hash equal."""
    buffer = io.BytesIO()
    with (gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as compressed,
          tarfile.open(fileobj=compressed, mode="w", format=tarfile.USTAR_FORMAT) as tar):
        for name in sorted(files):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(files[name]), 0o644
            tar.addfile(info, io.BytesIO(files[name]))
    return buffer.getvalue()


def _run_model(path: Path, inputs: np.ndarray, outputs: int) -> list[np.ndarray]:
    """The first `outputs` outputs of the model on `inputs` (float32, or int64 token ids as they are)."""
    tract = _tract()
    try:
        runnable = tract.nnef().load(str(path)).into_runnable()
        results = runnable.run([np.ascontiguousarray(inputs)])
        return [results[i].to_numpy() for i in range(outputs)]
    except tract.TractError as error:
        raise BuildError(f"tract could not run the NNEF model {path}: {str(error).splitlines()[0]}") from error


class NnefTarget(Target):
    kind: ClassVar[str] = "nnef"
    capability: ClassVar[str] = "tract"
    default_tolerance = "approximate"
    reference: ClassVar[str] = "fake_quant"
    run_batch: ClassVar[int | None] = 32  # onnxruntime/tract hold ~17 MB per ResNet-50 sample
    packages: ClassVar[tuple[str, ...]] = ("tract",)
    size_options: ClassVar[tuple[str, ...]] = ("quantized_kernels",)

    class Options(Target.Options):
        quantized_kernels: bool = True  # tract's integer conv/linear where the weights are per tensor

    options: Options

    @classmethod
    def layer_types(cls) -> frozenset[str]:
        return held(LAYER_EXPORTERS)

    @classmethod
    def float_ops(cls) -> frozenset[str]:
        """What the float op exporter spells, where the layer exporter takes float layers (islands use it)."""
        return held(FLOAT_OPS) if "float" in cls.layer_types() else frozenset()

    def runtime_version(self) -> dict[str, str]:
        return {"tract": str(_tract().version())}

    def stored_bytes(self, qgraph: QGraph) -> int:
        """The data of the archive's tensor files (headers aside): weights as tract reads them, dequantized
        float32 where a layer runs fake-quant float, int8 where tract's quantized kernels do."""
        e = build_document(qgraph, self.options.quantized_kernels)[0]
        return int(sum(array.nbytes for array, _ in e.variables.values()))

    def export(self, qgraph: QGraph, out_dir: Path) -> None:
        e, source, output, traced = build_document(qgraph, self.options.quantized_kernels)
        files = {GRAPH_FILE: e.document([source], [output]).encode()}
        if e.quant:
            files[QUANT_FILE] = e.quant_file().encode()
        files.update({f"{label}.dat": encode(array, quantized) for label, (array, quantized) in e.variables.items()})
        out_dir = Path(out_dir)
        (out_dir / ARCHIVE).write_bytes(_archive(files))
        manifest = {"archive": ARCHIVE, "input": qgraph.input, "output": qgraph.output,
                    "input_shape": list(qgraph.tensors[qgraph.input].shape),
                    "input_dtype": "int64" if qgraph.takes_indices else "float32",
                    "output_shape": list(qgraph.tensors[qgraph.output].shape), "trace": traced,
                    "quantized_tensors": sorted(e.quant)}
        (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")

    def run(self, artifact_dir: Path, inputs: np.ndarray, work_dir: Path) -> np.ndarray:
        """float32 (or int64 token ids) inputs (batch, *input shape) -> float32 outputs, run by tract."""
        artifact_dir = Path(artifact_dir)
        manifest = json.loads((artifact_dir / MANIFEST).read_text())
        inputs = np.asarray(inputs, dtype=manifest.get("input_dtype", "float32"))
        if list(inputs.shape[1:]) != manifest["input_shape"]:
            raise BuildError(f"NNEF artifact {artifact_dir} takes inputs of shape (batch, "
                             f"{', '.join(map(str, manifest['input_shape']))}), got {inputs.shape}")
        return _run_model(artifact_dir / manifest["archive"], inputs, 1)[0]

    def trace(self, artifact_dir: Path, inputs: np.ndarray, work_dir: Path) -> dict[str, np.ndarray]:
        """The real value of every QGraph tensor, by rerunning a copy of the model that outputs them all."""
        artifact_dir, work_dir = Path(artifact_dir), Path(work_dir)
        manifest = json.loads((artifact_dir / MANIFEST).read_text())
        unpacked = work_dir / "traced.nnef"
        with tarfile.open(artifact_dir / manifest["archive"], "r:gz") as tar:
            tar.extractall(unpacked, filter="data")
        graph = (unpacked / GRAPH_FILE).read_text()
        names = list(dict.fromkeys(manifest["trace"].values()))
        graph = _SIGNATURE.sub(lambda m: f"graph {m[1]}({m[2]}) -> ({', '.join(names)})", graph, count=1)
        (unpacked / GRAPH_FILE).write_text(graph)
        inputs = np.asarray(inputs, dtype=manifest.get("input_dtype", "float32"))
        values = dict(zip(names, _run_model(unpacked, inputs, len(names))))
        return {tensor: values[name] for tensor, name in manifest["trace"].items()}

    def rerun_script(self, artifact_dir: Path, inputs_file: str, outputs_file: str) -> str:
        """Run the archive in tract on raw float32 (int64 token ids) inputs and write raw float32 outputs."""
        manifest = json.loads((Path(artifact_dir) / MANIFEST).read_text())
        archive = f"{Path(artifact_dir).name}/{manifest['archive']}"
        dtype = manifest.get("input_dtype", "float32")
        program = ("import sys, numpy as np, tract; "
                   f"x = np.fromfile(sys.argv[2], np.{dtype}).reshape(-1, {', '.join(map(str, manifest['input_shape']))}); "
                   "y = tract.nnef().load(sys.argv[1]).into_runnable().run([x])[0].to_numpy(); "
                   "y.astype(np.float32).tofile(sys.argv[3])")
        return '"${PYTHON:-python3}" ' + shlex.join(["-c", program, archive, inputs_file, outputs_file]) + "\n"
