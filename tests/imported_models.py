"""Imported (already quantized) models against the runtime they came from; shared by tests and bench/imported.py.

`target_figures` reads a finished build of a recipe and, for each of its
targets, runs the artifact in its real runtime on the evaluation data and
compares it with dabuild's integer reference and with the original model run
by its own runtime (`ORIGINAL_RUNTIMES`: onnxruntime, qonnx's executor, Keras;
a frontend adds its runtime here). Disagreement is counted in steps
of the output's quantization scale. Where onnxruntime's u8s8 kernels saturate
the original on this CPU (x86-64 without VNNI), the original's outputs are
those of onnxruntime's exact x64 precision mode, and the row's note names the
saturated layers: the file's arithmetic, not a CPU's clipping of it, is what
dabuild's artifacts are held to.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dabuild.data import load_inputs, load_labels
from dabuild.ir.graph import Graph
from dabuild.plugins import TARGETS, load
from dabuild.qir.qgraph import QGraph
from dabuild.qir.reference import run_quantized
from dabuild.recipe import Recipe
from dabuild.targets.check import reference_inputs


def run_onnxruntime(path: Path, x: np.ndarray) -> tuple[np.ndarray, str | None]:
    """onnxruntime's outputs; where its u8s8 kernels can saturate on this CPU (no VNNI), those of its x64
    precision mode, which runs the file's arithmetic exactly, and the note naming the layers that saturate."""
    from dabuild.targets.onnx.saturation import run_original

    original = run_original(path, x)
    return original.exact, original.describe() if original.saturated else None


def run_qonnx_executor(path: Path, x: np.ndarray) -> tuple[np.ndarray, str | None]:
    from qonnx_runtime import run_qonnx

    return run_qonnx(path, x), None


def run_keras(path: Path, x: np.ndarray) -> tuple[np.ndarray, str | None]:
    """Keras (torch backend) running the .keras file, HGQ2's quantized layers included."""
    from dabuild.trace.keras_frontend.loading import load_file

    return load_file(path).predict(x, verbose=0), None


# runtime -> the original file's outputs on this machine, and a note where the runtime's default run departs
# from the file's arithmetic here (onnxruntime's u8s8 saturation without VNNI), which the outputs then avoid.
ORIGINAL_RUNTIMES: dict[str, Callable[[Path, np.ndarray], tuple[np.ndarray, str | None]]] = {
    "onnxruntime": run_onnxruntime,
    "qonnx": run_qonnx_executor,
    "keras": run_keras,
}


@dataclass(frozen=True)
class TargetFigures:
    target: str
    kind: str
    accuracy: float            # through the artifact, in its runtime
    original_accuracy: float   # the original file in its own runtime
    steps_vs_reference: int    # most output steps between the artifact and dabuild's integer reference
    steps_vs_original: int     # most output steps between the artifact and the original runtime
    original_note: str | None = None  # how the original runtime's default run departs from the file here, if it does


def _steps(a: np.ndarray, b: np.ndarray, scale: float) -> int:
    return int(np.round(np.abs(a.astype(np.float64) - b.astype(np.float64)).max() / scale))


def artifact_outputs(recipe: Recipe, build: Path, target_name: str, x: np.ndarray,
                     option_overrides: dict[str, dict] | None = None) -> tuple[np.ndarray, QGraph]:
    """The artifact of `target_name` run in its runtime on float `x`, as real values, and the QGraph it was built
    from; `option_overrides` (target kind -> options) changes how it runs (e.g. hdl: simulate never)."""
    spec = next(t for t in recipe.targets if t.name == target_name)
    target_class = load(TARGETS, spec.kind)
    options = {**spec.options, **(option_overrides or {}).get(spec.kind, {})}
    target = target_class(target_class.Options.model_validate(options))
    capability = spec.capability or target_class.capability
    qgraph = QGraph.load(build / f"tune-{capability}" / "qgraph")
    with tempfile.TemporaryDirectory(prefix="dabuild-imported-") as work:
        outputs = np.asarray(target.run(build / f"export-{target_name}", reference_inputs(target.reference, qgraph, x),
                                        Path(work)))
    if np.issubdtype(outputs.dtype, np.integer):
        outputs = qgraph.output_params.dequantize(outputs)
    return outputs, qgraph


def target_figures(recipe: Recipe, build: Path, original: Path, runtime: str, targets: list[str] | None = None,
                   option_overrides: dict[str, dict] | None = None) -> list[TargetFigures]:
    """Per target of the built recipe: accuracy and output-step disagreement (module doc)."""
    spec = recipe.data.evaluation
    x = next(iter(load_inputs(spec, [t.name for t in Graph.load(build / "trace").inputs]).values()))
    labels = load_labels(spec)
    expected, note = ORIGINAL_RUNTIMES[runtime](original, x)
    rows = []
    for target in targets or [t.name for t in recipe.targets]:
        outputs, qgraph = artifact_outputs(recipe, build, target, x, option_overrides)
        scale = qgraph.output_params.scale
        rows.append(TargetFigures(
            target, next(t.kind for t in recipe.targets if t.name == target),
            float(np.mean(outputs.argmax(axis=1) == labels)), float(np.mean(expected.argmax(axis=1) == labels)),
            _steps(outputs, run_quantized(qgraph, x), scale), _steps(outputs, expected, scale), note))
    return rows
