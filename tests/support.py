"""What tests in every folder import by name: the repository's paths, private copies of its recipes (and a cap
on their trials), the native kernels' vector paths, and a recipe traced and calibrated (tests/ is on pytest's
pythonpath)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DIGITS = REPO / "recipes" / "digits"


def copy_recipes(root: Path, *names: str) -> Path:
    """Private copies of recipes/<name>, side by side under root/recipes, as they read each other's data."""
    folder = root / "recipes"
    for name in names:
        shutil.copytree(REPO / "recipes" / name, folder / name, ignore=shutil.ignore_patterns("build", "__pycache__"))
    return folder


def limit_trials(recipe: Path, count: int) -> None:
    """Cap a copied recipe's search at `count` trials: a test that proves a recipe builds and checks needs
    no more than a few; the full search is the recipe's own business (and minutes of da4ml's estimates)."""
    path = recipe / "recipe.yaml"
    text, replaced = re.subn(r"max_trials: \d+", f"max_trials: {count}", path.read_text())
    assert replaced == 1, f"{path} states max_trials once"
    path.write_text(text)


def _vector_widths() -> list[int]:
    from dabuild.ir.kernels.native import vector_widths

    return vector_widths()


VECTOR_WIDTHS = _vector_widths()  # every vector path of the native kernels this machine can run, widest first


def trace_and_calibrate(recipe_file: Path, root: Path) -> tuple[Path, Path]:
    """The trace and calibrate stages of a recipe, run directly into root/trace and root/calibrate."""
    from dabuild.data import batches, load_inputs
    from dabuild.ir.graph import Graph
    from dabuild.progress import Progress
    from dabuild.quant.calibrate import calibrate
    from dabuild.recipe import load_recipe
    from dabuild.trace.base import trace_stage

    recipe = load_recipe(recipe_file)
    model = recipe.model.model_copy(update={"source": str(recipe.base_dir / recipe.model.source)})  # as planning resolves it
    trace_stage(model, root / "trace", Progress.silent())
    graph = Graph.load(root / "trace")
    spec = recipe.data.calibration
    arrays = load_inputs(spec, [t.name for t in graph.inputs])
    calibrate(graph, batches(arrays, spec.batch_size), Progress.silent()).save(root / "calibrate")
    return root / "trace", root / "calibrate"
