"""Fixtures shared by the end-to-end tests: a private copy of the digits example and a private cache; and
a test that needs an extra this install lacks skips, naming it."""

from __future__ import annotations

import importlib.util
import re
import shutil
from collections.abc import Generator
from pathlib import Path

import pytest

from dabuild.errors import BuildError

REPO = Path(__file__).resolve().parent.parent
DIGITS = REPO / "recipes" / "digits"


# What dabuild says when a package of an optional extra is missing (registry.import_extra, the onnx target).
_MISSING_EXTRA = re.compile(r"needs the Python package '([\w.-]+)', which is not installed; "
                            r"install it with `pip install dabuild\[(\w+)\]`")


def missing_extra(error: BaseException) -> str | None:
    """Why a test cannot run here, when `error` is dabuild refusing for want of an optional extra's package
    that really is absent (a broken install of a present one stays a failure)."""
    found = _MISSING_EXTRA.search(str(error)) if isinstance(error, BuildError) else None
    if found is None or importlib.util.find_spec(found[1].replace("-", "_")) is not None:
        return None
    return f"needs dabuild[{found[2]}]: the Python package {found[1]!r} is not installed"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, object, None]:
    """A core-only install (no extras) skips what needs an extra, with the extra's name, instead of failing:
    dabuild loads optional packages at lookup (a recipe's target, a registry), so only running tells."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    reason = missing_extra(call.excinfo.value) if call.excinfo is not None and report.failed else None
    if reason is not None:
        report.outcome = "skipped"
        report.longrepr = (str(item.path), (item.location[1] or 0) + 1, f"Skipped: {reason}")


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
