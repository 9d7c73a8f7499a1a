"""Models that arrive quantized, built by dabuild and measured against the runtime they came from.

Per imported model (a row of MODELS: its recipe, the original file and the
runtime that runs it) the recipe is built (strategy `given`), then for each
target the artifact runs in its real runtime on the whole evaluation set:
its accuracy next to the original runtime's, and the most output steps
(of the output's quantization scale) by which it differs from dabuild's
integer reference (goal 0; `approximate` targets may show 1) and from the
original runtime (goal <= 1). For models with an hdl target, the logic's
LUTs and latency through dabuild (what the hdl target exports) against da4ml
directly: for the QONNX MLP the same network written with da4ml's tracing API
(bench/hdl.py's `mlp_by_hand`, from the given integer weights and fixed-point
types), for HGQ2 models da4ml's own conversion of the Keras model (hgq2's DAIS
tracer plugin, `da4ml.converter.trace_model`).

A frontend adds its models by appending an `Imported` row (and, for a new
original runtime, an entry of tests/imported_models.py's ORIGINAL_RUNTIMES); a
`variant` builds a private copy of a recipe with its original file made
another way (here: quantize_static's QOperator format, int8 per-channel,
int4 weights).

Usage: python bench/imported.py
"""

from __future__ import annotations

import importlib.util
import logging
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests"))
from imported_models import target_figures  # noqa: E402  (bench/ and tests/ are not packages)

from dabuild.cli import main as dabuild  # noqa: E402
from dabuild.qir.qgraph import QGraph  # noqa: E402
from dabuild.recipe import load_recipe  # noqa: E402


@dataclass(frozen=True)
class Imported:
    name: str
    recipe: str                                     # folder under recipes/
    original: str                                   # the original file, in the recipe's folder
    runtime: str                                    # a key of imported_models.ORIGINAL_RUNTIMES
    by_hand: Callable[[QGraph, object, Path], object] | None = None  # (qgraph, HWConfig, original) -> CombLogic
    variant: Callable[[Path], None] | None = None   # rewrites the original file of a copy of the recipe


def quantize_static_variant(**options: object) -> Callable[[Path], None]:
    """recipes/digits-cnn-qdq's model made again by quantize_static with other options (format, types)."""
    def make(path: Path) -> None:
        from onnxruntime.quantization import QuantFormat, QuantType  # noqa: F401  (options name them)

        spec = importlib.util.spec_from_file_location("make_model", REPO / "recipes" / "digits-cnn-qdq" / "make_model.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.make(path, **options)
    return make


def mlp_by_hand(qgraph: QGraph, hwconf: object, original: Path) -> object:
    """the MLP written with da4ml's tracing API."""
    from hdl import mlp_by_hand as written  # bench/hdl.py: dense layers written with da4ml's tracing API

    return written(qgraph, hwconf)


def hgq2_by_da4ml(qgraph: QGraph, hwconf: object, original: Path) -> object:
    """da4ml's own conversion of the HGQ2 model."""
    from da4ml.converter import trace_model
    from da4ml.trace import comb_trace

    from dabuild.trace.keras_frontend.loading import load_file

    return comb_trace(*trace_model(load_file(original), hwconf=hwconf))


def _variants() -> list[Imported]:
    from onnxruntime.quantization import QuantFormat, QuantType

    qdq = ("digits-cnn-qdq", "model.onnx", "onnxruntime")
    return [
        Imported("digits-cnn QDQ u8 (quantize_static)", *qdq),
        Imported("digits-cnn QOperator u8", *qdq, variant=quantize_static_variant(quant_format=QuantFormat.QOperator)),
        Imported("digits-cnn QDQ s8 per-channel", *qdq, variant=quantize_static_variant(
            activation_type=QuantType.QInt8, per_channel=True)),
        Imported("digits-cnn QDQ u8, int4 weights", *qdq, variant=quantize_static_variant(
            weight_type=QuantType.QInt4, per_channel=True)),
        Imported("digits MLP QONNX (Brevitas-style, pot)", "digits-qonnx", "model.onnx", "qonnx", mlp_by_hand),
        Imported("jet MLP Keras (float; dabuild tunes)", "jet-mlp-keras", "model.keras", "keras"),
        Imported("jet MLP HGQ2 (Keras, given)", "jet-mlp-hgq", "model.keras", "keras", hgq2_by_da4ml),
        Imported("digits CNN HGQ2 (Keras, given)", "digits-hgq-cnn", "model.keras", "keras", hgq2_by_da4ml),
    ]


MODELS = _variants()


def hdl_row(recipe_folder: Path, build: Path, target: str, by_hand: Callable, original: Path) -> str:
    """LUTs and latency through dabuild vs da4ml directly, for the hdl target `target`."""
    from dabuild.targets.hdl import HdlTarget
    from dabuild.targets.hdl.program import trace

    recipe = load_recipe(recipe_folder / "recipe.yaml")
    spec = next(t for t in recipe.targets if t.name == target)
    options = HdlTarget.Options.model_validate(spec.options)
    from da4ml.trace import HWConfig

    hwconf = HWConfig(options.adder_size, options.carry_size, options.latency_cutoff)
    qgraph = QGraph.load(build / f"tune-{spec.capability or HdlTarget.capability}" / "qgraph")
    ours, theirs = trace(qgraph, hwconf), by_hand(qgraph, hwconf, original)
    equal = ours.cost == theirs.cost and tuple(ours.latency) == tuple(theirs.latency)
    params = qgraph.input_params
    x = np.random.default_rng(0).integers(params.qmin, params.qmax + 1, (2000, *qgraph.tensors[qgraph.input].shape))
    same = np.array_equal(ours.predict(x * params.scale), theirs.predict(x * params.scale))
    peer = (by_hand.__doc__ or "da4ml directly").strip().rstrip(".")
    return (f"    {target}: LUTs dabuild {ours.cost:.1f} vs {peer} {theirs.cost:.1f}; latency "
            f"{ours.latency[1]:.1f} vs {theirs.latency[1]:.1f} ({'equal' if equal else 'DIFFERENT'}); "
            f"same outputs on 2000 inputs: {'yes' if same else 'NO'}")


def main() -> None:
    logging.disable(logging.WARNING)  # onnxruntime's quantizer advises on every variant it makes
    root = Path(tempfile.mkdtemp(prefix="dabuild-bench-imported-"))
    header = (f"{'model':40s} {'target':7s} {'kind':5s} {'acc artifact':>12s} {'acc original':>12s} "
              f"{'steps vs ref':>12s} {'steps vs orig':>13s}")
    print(header)
    print("-" * len(header))
    notes = []
    for index, model in enumerate(MODELS):
        folder = REPO / "recipes" / model.recipe
        if model.variant is not None:  # a private copy of the recipe (and the ones it reads data from)
            copies = root / f"variant-{index}"
            shutil.copytree(REPO / "recipes", copies, ignore=shutil.ignore_patterns("build", "__pycache__"))
            folder = copies / model.recipe
            model.variant(folder / model.original)
        if dabuild(["build", str(folder), "--build-dir", str(root / f"build-{index}"), "-q"]) != 0:
            print(f"{model.name}: the build failed")
            continue
        build = root / f"build-{index}" / load_recipe(folder / "recipe.yaml").name
        recipe = load_recipe(folder / "recipe.yaml")
        rows = target_figures(recipe, build, folder / model.original, model.runtime,
                              option_overrides={"hdl": {"simulate": "never"}})  # DAIS: what the RTL check matched
        for row in rows:
            print(f"{model.name:40s} {row.target:7s} {row.kind:5s} {row.accuracy:12.4f} {row.original_accuracy:12.4f} "
                  f"{row.steps_vs_reference:12d} {row.steps_vs_original:13d}")
            if row.original_note and f"  {model.name}: {row.original_note}" not in notes:
                notes.append(f"  {model.name}: {row.original_note}")
            if row.kind == "hdl" and model.by_hand is not None:
                notes.append(f"  {model.name}\n{hdl_row(folder, build, row.target, model.by_hand, folder / model.original)}")
    print("\ngoals: steps vs ref 0 (exact targets; approximate ones may show 1), steps vs orig <= 1")
    if notes:
        print("notes: the original runtime on this CPU; hdl logic through dabuild vs da4ml directly (goal: equal)")
        print("\n".join(notes))


if __name__ == "__main__":
    main()
