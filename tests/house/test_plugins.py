"""Third-party plugins: a package installed with pip registers a tracer and a target by entry points."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from dabuild import plugins

PLUGIN_PACKAGE = Path(__file__).resolve().parents[1] / "plugin_pkg"


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """dabuild-testplugin installed by pip into a folder of its own, put on sys.path."""
    site = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(PLUGIN_PACKAGE)],
        check=True,
    )
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    plugins._entry_points.cache_clear()
    yield site
    sys.path.remove(str(site))
    sys.modules.pop("dabuild_testplugin", None)
    plugins._entry_points.cache_clear()


def test_plugin_names_are_listed(plugin_site: Path) -> None:
    assert "dabuild_testplugin" in plugins.available(plugins.TRACERS)
    assert "hooked-c" in plugins.available(plugins.TARGETS)


def test_trace_model_picks_the_plugin_by_the_model_type_module(plugin_site: Path) -> None:
    import dabuild_testplugin
    from support import DIGITS

    from dabuild.ir.interpreter import run
    from dabuild.trace.base import trace_model

    weights = dict(np.load(DIGITS / "weights.npz"))
    model = dabuild_testplugin.build(weights)
    graph = trace_model(model)
    x = np.load(DIGITS / "data.npz")["x_test"][:32]
    np.testing.assert_allclose(run(graph, {"x": x})[graph.outputs[0]], model(x), rtol=1e-5, atol=1e-5)


def test_recipe_with_plugin_framework_and_hooked_target_builds(plugin_site: Path, digits: Path, tmp_path: Path) -> None:
    log = tmp_path / "hooks.log"
    recipe = digits / "recipe.yaml"
    text = recipe.read_text()
    text = text.replace("framework: numpy", "framework: dabuild_testplugin")
    text = text.replace("source: model.py:build", "source: dabuild_testplugin:build")
    text = text.replace("kind: c\n", "kind: hooked-c\n")
    recipe.write_text(text)
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(plugin_site), os.environ.get("PYTHONPATH", "")]),
        DABUILD_CACHE=str(tmp_path / "cache"),
        DABUILD_TESTPLUGIN_LOG=str(log),
    )
    command = [sys.executable, "-m", "dabuild", "build", str(digits), "--build-dir", str(tmp_path / "build")]
    first = subprocess.run(command, check=False, env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    assert "check:mcu: exact passed" in first.stdout
    assert log.read_text().splitlines() == ["pre_trace dabuild_testplugin:build", "post_trace 3 nodes"]
    again = subprocess.run(command, check=False, env=env, capture_output=True, text=True)
    assert again.returncode == 0 and "0 executed" in again.stdout
    assert len(log.read_text().splitlines()) == 2  # hooks run when trace runs, not on a no-op
