"""Fixtures shared by the end-to-end tests: a private copy of the digits example and a private cache."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

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


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A run cache of the test's own, so tests neither see nor fill the user's."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("DABUILD_CACHE", str(folder))
    return folder


@pytest.fixture
def digits(tmp_path: Path) -> Path:
    """A copy of the bundled digits recipe folder that a test may edit, with its C target only.

    The pipeline's behaviour does not depend on which runtimes check the
    artifacts, so these tests keep the one that needs no extra (and is fastest);
    tests/test_example.py builds the bundled recipe with all its targets.
    """
    folder = tmp_path / "digits"
    shutil.copytree(DIGITS, folder, ignore=shutil.ignore_patterns("build", "__pycache__"))
    recipe = folder / "recipe.yaml"
    text = recipe.read_text()
    recipe.write_text(text[: text.index("  - name: ort\n")])
    return folder


def _vector_widths() -> list[int]:
    from dabuild.ir.kernels.native import vector_widths

    return vector_widths()


VECTOR_WIDTHS = _vector_widths()  # every vector path of the native kernels this machine can run, widest first


@pytest.fixture(params=VECTOR_WIDTHS, ids=[f"{width}-byte vectors" for width in VECTOR_WIDTHS])
def vector_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """Runs the test on one vector path of the native kernels (DABUILD_VECTOR_BYTES): every path, in turn."""
    monkeypatch.setenv("DABUILD_VECTOR_BYTES", str(request.param))
    return request.param
