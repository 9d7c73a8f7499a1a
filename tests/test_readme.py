"""README's main command, run literally in a fresh clone and a fresh virtual environment."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def readme_commands() -> list[str]:
    """The shell blocks of README.md's "two commands" section, in order."""
    text = (REPO / "README.md").read_text()
    section = text.split("## The two commands", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.*?)\n```", section, re.DOTALL)


def _clean_env(tmp_path: Path) -> dict[str, str]:
    """The caller's environment without any active virtual environment, and a private cache."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if "venv" not in p)
    env["DABUILD_CACHE"] = str(tmp_path / "cache")
    return env


def fresh_clone(tmp_path: Path) -> Path:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs git and a git checkout of dabuild")
    clone = tmp_path / "fresh"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    return clone


def test_readme_names_the_test_command_that_ci_runs() -> None:
    main_command, test_command = readme_commands()
    assert "dabuild build recipes/digits" in main_command
    assert test_command in (REPO / ".ci" / "run").read_text()


@pytest.mark.slow
def test_readme_main_command_builds_the_example_from_a_fresh_clone(tmp_path: Path) -> None:
    clone = fresh_clone(tmp_path)
    main_command = readme_commands()[0]
    result = subprocess.run(
        ["bash", "-c", main_command.replace("python3 ", f"{sys.executable} ", 1)],
        check=False, cwd=clone,
        capture_output=True,
        text=True,
        env=_clean_env(tmp_path),
        timeout=900,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "check:mcu: exact passed" in result.stdout
    assert "goal met" in result.stdout
    assert (clone / "build" / "digits-mlp" / "export-mcu" / "model.c").exists()


@pytest.mark.slow
def test_wheel_install_carries_capabilities_and_schemas(tmp_path: Path) -> None:
    clone = fresh_clone(tmp_path)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(clone)], check=True, timeout=900)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    listing = subprocess.run(
        [str(venv / "bin" / "dabuild"), "capabilities"], cwd=outside, capture_output=True, text=True, check=True
    )
    assert listing.stdout.split()[0] == "c"
    schemas = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "from dabuild.resources import data_dir; print(sorted(p.name for p in data_dir('schemas').iterdir()))"],
        cwd=outside,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "recipe.schema.json" in schemas.stdout and "site-packages" in subprocess.run(
        [str(venv / "bin" / "python"), "-c", "from dabuild.resources import data_dir; print(data_dir('schemas'))"],
        cwd=outside, capture_output=True, text=True, check=True,
    ).stdout


def test_readme_names_the_extras_each_example_recipe_needs() -> None:
    """Every recipe under recipes/ is in the README's table, with the extras its framework and targets need."""
    import yaml

    text = (REPO / "README.md").read_text()
    rows = dict(re.findall(r"^\| `(recipes/[\w-]+)` \| [^|]+ \| `([\w,]+)`", text, re.MULTILINE))
    recipes = sorted(p.parent for p in (REPO / "recipes").glob("*/recipe.yaml"))
    assert set(rows) == {f"recipes/{p.name}" for p in recipes}
    by_target = {"c": set(), "onnx": {"onnx"}, "nnef": {"tract"}, "hdl": {"hdl"}, "tflite": {"tflite"}}
    for folder in recipes:
        recipe = yaml.safe_load((folder / "recipe.yaml").read_text())
        model = recipe["model"]
        framework = model.get("framework") or ("onnx" if model["source"].endswith(".onnx") else "numpy")
        needed = {"torch": {"torch"}, "onnx": {"onnx"}}.get(framework, set())
        for target in recipe["targets"]:
            needed |= by_target[target["kind"]]
        assert needed <= set(rows[f"recipes/{folder.name}"].split(",")), folder.name
