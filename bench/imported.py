"""Models that arrive quantized, built by dabuild and measured against the runtime they came from.

Per imported model (a row of MODELS: its recipe, the original file and the
runtime that runs it) the recipe is built (strategy `given`), then for each
target the artifact runs in its real runtime on the whole evaluation set:
its accuracy next to the original runtime's, and the most output steps
(of the output's quantization scale) by which it differs from dabuild's
integer reference (goal 0; `approximate` targets may show 1) and from the
original runtime (goal <= 1). For models with an hdl target, the logic's
LUTs and latency through dabuild (what the hdl target exports) against the
same network written directly with da4ml's tracing API (bench/hdl.py's
`mlp_by_hand`, from the given integer weights and fixed-point types).

A frontend adds its models by appending an `Imported` row (and, for a new
original runtime, an entry of tests/imported_models.py's ORIGINAL_RUNTIMES).

Usage: python bench/imported.py
"""

from __future__ import annotations

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
from dabuild.quant.qgraph import QGraph  # noqa: E402
from dabuild.recipe import load_recipe  # noqa: E402


@dataclass(frozen=True)
class Imported:
    name: str
    recipe: str                                     # folder under recipes/
    original: str                                   # the original file, in the recipe's folder
    runtime: str                                    # a key of imported_models.ORIGINAL_RUNTIMES
    by_hand: Callable[[QGraph, object], object] | None = None  # (qgraph, HWConfig) -> da4ml CombLogic


def mlp_by_hand(qgraph: QGraph, hwconf: object) -> object:
    from hdl import mlp_by_hand as written  # bench/hdl.py: dense layers written with da4ml's tracing API

    return written(qgraph, hwconf)


MODELS = [
    Imported("digits-cnn QDQ (onnxruntime quantize_static)", "digits-cnn-qdq", "model.onnx", "onnxruntime"),
    Imported("digits MLP QONNX (Brevitas-style, pot)", "digits-qonnx", "model.onnx", "qonnx", mlp_by_hand),
]


def hdl_row(recipe_folder: Path, build: Path, target: str, by_hand: Callable) -> str:
    """LUTs and latency through dabuild vs da4ml directly, for the hdl target `target`."""
    from dabuild.targets.hdl import HdlTarget
    from dabuild.targets.hdl.program import trace

    recipe = load_recipe(recipe_folder / "recipe.yaml")
    spec = next(t for t in recipe.targets if t.name == target)
    options = HdlTarget.Options.model_validate(spec.options)
    from da4ml.trace import HWConfig

    hwconf = HWConfig(options.adder_size, options.carry_size, options.latency_cutoff)
    qgraph = QGraph.load(build / f"tune-{spec.capability or HdlTarget.capability}" / "qgraph")
    ours, theirs = trace(qgraph, hwconf), by_hand(qgraph, hwconf)
    equal = ours.cost == theirs.cost and tuple(ours.latency) == tuple(theirs.latency)
    params = qgraph.input_params
    x = np.random.default_rng(0).integers(params.qmin, params.qmax + 1, (2000, *qgraph.tensors[qgraph.input].shape))
    same = np.array_equal(ours.predict(x * params.scale), theirs.predict(x * params.scale))
    return (f"    {target}: LUTs dabuild {ours.cost:.1f} vs da4ml directly {theirs.cost:.1f}; latency "
            f"{ours.latency[1]:.1f} vs {theirs.latency[1]:.1f} ({'equal' if equal else 'DIFFERENT'}); "
            f"same outputs on 2000 inputs: {'yes' if same else 'NO'}")


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="dabuild-bench-imported-"))
    header = (f"{'model':46s} {'target':7s} {'kind':5s} {'acc artifact':>12s} {'acc original':>12s} "
              f"{'steps vs ref':>12s} {'steps vs orig':>13s}")
    print(header)
    print("-" * len(header))
    notes = []
    for model in MODELS:
        folder = REPO / "recipes" / model.recipe
        if dabuild(["build", str(folder), "--build-dir", str(root), "-q"]) != 0:
            print(f"{model.name}: the build failed")
            continue
        build = root / load_recipe(folder / "recipe.yaml").name
        recipe = load_recipe(folder / "recipe.yaml")
        rows = target_figures(recipe, build, folder / model.original, model.runtime,
                              option_overrides={"hdl": {"simulate": "never"}})  # DAIS: what the RTL check matched
        for row in rows:
            print(f"{model.name:46s} {row.target:7s} {row.kind:5s} {row.accuracy:12.4f} {row.original_accuracy:12.4f} "
                  f"{row.steps_vs_reference:12d} {row.steps_vs_original:13d}")
            if row.kind == "hdl" and model.by_hand is not None:
                notes.append(f"  {model.name}\n{hdl_row(folder, build, row.target, model.by_hand)}")
    print("\ngoals: steps vs ref 0 (exact targets; approximate ones may show 1), steps vs orig <= 1")
    if notes:
        print("hdl logic through dabuild vs written directly with da4ml (goal: equal)")
        print("\n".join(notes))


if __name__ == "__main__":
    main()
