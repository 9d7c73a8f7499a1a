"""Fixtures of the tuning tests: the digits CNN, traced and calibrated."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from support import REPO, trace_and_calibrate


@pytest.fixture(scope="session")
def cnn(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, tuple[Path, Path]]:
    """A private copy of recipes/digits-cnn and its traced graph and calibration statistics folders."""
    pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("digits-cnn")
    folder = root / "digits-cnn"
    shutil.copytree(REPO / "recipes" / "digits-cnn", folder, ignore=shutil.ignore_patterns("build", "__pycache__"))
    return folder, trace_and_calibrate(folder / "recipe.yaml", root)
