"""Imported Keras models: dabuild's artifacts against Keras itself and against dabuild's own reference.

The rows of bench/imported.py (issue 14) for the Keras frontend, with the same
columns. Each recipe is built with `dabuild build` (the user cache makes a
rebuild cheap); then, on the recipe's evaluation data, every target's artifact
is run by its own runtime (compiled C, onnxruntime, da4ml's DAIS interpreter)
and compared:

- accuracy through the artifact, and through Keras running the original model;
- the largest disagreement in output steps (one step = the output's scale)
  with dabuild's reference (goal 0; onnxruntime is checked at `approximate`)
  and with Keras (for a float model dabuild quantized itself, this measures
  the quantization, not a disagreement of runtimes);
- for the hdl target, da4ml's LUT estimate and latency of the artifact, and
  those of da4ml's own conversion of the model where da4ml has one (HGQ2
  models whose quantizers round TRN or RND, the modes da4ml implements; `-`
  with the reason otherwise).

Usage: python bench/imported_keras.py [--build-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

os.environ.setdefault("KERAS_BACKEND", "torch")

from dabuild import plugins  # noqa: E402
from dabuild.cli import main as dabuild  # noqa: E402
from dabuild.data import load_inputs, load_labels  # noqa: E402
from dabuild.quant.qgraph import QGraph  # noqa: E402
from dabuild.recipe import load_recipe  # noqa: E402
from dabuild.targets.check import real, reference_inputs, reference_outputs  # noqa: E402
from dabuild.trace.keras_frontend.loading import load_file  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
RECIPES = ("jet-mlp-keras", "digits-hgq-cnn")
DA4ML_ROUNDING = ("TRN", "RND")  # the round modes da4ml's quantize takes (and so its own HGQ2 conversion)
COLUMNS = ("model", "target", "accuracy artifact", "accuracy Keras", "max steps vs dabuild ref", "max steps vs Keras",
           "LUTs dabuild", "LUTs da4ml", "latency dabuild", "latency da4ml")


def da4ml_direct(model) -> tuple[str, str]:
    """LUTs and latency of da4ml's own conversion of an HGQ2 model (its `keras` tracer plugin, from hgq2), with
    the input already of the first input quantizer's type, as dabuild's logic takes it; or why there is none."""
    from da4ml.converter import trace_model
    from da4ml.trace import HWConfig, comb_trace

    from dabuild.trace.keras_frontend.hgq import FixedQuantizer

    quantized = [layer for layer in model.layers if getattr(layer, "enable_iq", False)]
    if not quantized:
        return "- (float model)", "-"
    first = FixedQuantizer.of(quantized[0].iq, tuple(model.inputs[0].shape[1:]), "input quantizer")
    modes = {FixedQuantizer.of(layer.iq, (1,), "iq").round_mode for layer in quantized}
    if not modes <= set(DA4ML_ROUNDING):
        return f"- (da4ml rounds {'/'.join(DA4ML_ROUNDING)} only; model: {'/'.join(sorted(modes))})", "-"
    kif = tuple(int(np.max(v)) for v in (first.k, first.i, first.f))
    comb = comb_trace(*trace_model(model, hwconf=HWConfig(1, -1, -1), inputs_kif=kif))
    return f"{comb.cost:.0f}", f"{comb.latency[1]:.0f}"


def target_row(recipe, spec, build: Path, x: np.ndarray, y: np.ndarray, keras_out: np.ndarray,
               direct: tuple[str, str]) -> list[str]:
    target_class = plugins.load(plugins.TARGETS, spec.kind)
    target = target_class(target_class.Options.model_validate(spec.options))
    capability = spec.capability or target_class.capability
    qgraph = QGraph.load(build / f"tune-{capability}" / "qgraph")
    inputs = reference_inputs(target.reference, qgraph, x)
    with tempfile.TemporaryDirectory() as work:
        actual = np.asarray(target.run(build / f"export-{spec.name}", inputs, Path(work)))
    params = qgraph.output_params
    got = real(actual, params)
    steps_reference = np.abs(got - real(reference_outputs(target.reference, qgraph, inputs), params)).max()
    steps_keras = np.abs(got - keras_out).max() / params.scale
    luts = latency = "-"
    if spec.kind == "hdl":
        manifest = json.loads((build / f"export-{spec.name}" / "hdl.json").read_text())
        luts, latency = f"{manifest['cost']:.0f}", f"{manifest['latency']:.0f}"
    return [recipe.name, f"{spec.name} ({spec.kind})", f"{np.mean(got.argmax(axis=1) == y):.4f}",
            f"{np.mean(keras_out.argmax(axis=1) == y):.4f}", f"{steps_reference / params.scale:.0f}",
            f"{steps_keras:.1f}", luts, direct[0] if spec.kind == "hdl" else "-", latency,
            direct[1] if spec.kind == "hdl" else "-"]


def run_keras(path: Path, x: np.ndarray) -> np.ndarray:
    """The original runtime: Keras (torch backend) running the model file, as bench/imported.py's ORIGINAL_RUNTIMES
    entries do (path, float inputs) -> outputs."""
    return np.asarray(load_file(path).predict(x, verbose=0), dtype=np.float64)


def rows(name: str, build_root: Path) -> list[list[str]]:
    folder = REPO / "recipes" / name
    recipe = load_recipe(folder / "recipe.yaml")
    if recipe.tuning.strategy not in plugins.available(plugins.STRATEGIES):
        return [[name, "-", f"needs tuning strategy {recipe.tuning.strategy!r}", *["-"] * (len(COLUMNS) - 3)]]
    if dabuild(["build", str(folder), "--build-dir", str(build_root), "-q"]) != 0:
        raise SystemExit(f"building recipes/{name} failed")
    evaluation = recipe.data.evaluation
    [x] = load_inputs(evaluation, recipe.base_dir, list(recipe.model.inputs or ["x"])).values()
    y = load_labels(evaluation, recipe.base_dir)
    model = load_file(recipe.base_dir / recipe.model.source)
    keras_out = run_keras(recipe.base_dir / recipe.model.source, x)
    direct = da4ml_direct(model)
    return [target_row(recipe, spec, build_root / recipe.name, x, y, keras_out, direct) for spec in recipe.targets]


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build-dir", type=Path, default=None, help="where the recipes are built (default: a temp dir)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        build_root = args.build_dir or Path(scratch)
        table = [row for name in RECIPES for row in rows(name, build_root)]
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + " --- |" * len(COLUMNS))
    for row in table:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
