"""The digits-torch example recipe end to end: trace (torch.export), calibrate, tune, export:c, check:c."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from conftest import copy_recipes  # noqa: E402

from dabuild.cli import main  # noqa: E402
from dabuild.ir import Graph  # noqa: E402
from dabuild.progress import Progress  # noqa: E402
from dabuild.trace import trace_stage  # noqa: E402

RECIPES = Path(__file__).resolve().parent.parent / "recipes"
ALL_STAGES = {"trace", "calibrate", "tune:c", "export:mcu", "check:mcu"}


@pytest.fixture
def recipes(tmp_path: Path) -> Path:
    """Private copies of digits-torch and of digits, whose data it reads (../digits/data.npz)."""
    return copy_recipes(tmp_path, "digits-torch", "digits")


def build(recipe_dir: Path, build_root: Path) -> dict:
    assert main(["build", str(recipe_dir), "--build-dir", str(build_root), "-q"]) == 0
    return json.loads((build_root / "digits-torch" / "build.json").read_text())


def outcomes(summary: dict, outcome: str) -> set[str]:
    return {stage for stage, result in summary["outcomes"].items() if result == outcome}


def test_digits_torch_builds_and_checks_bit_exact(recipes: Path, tmp_path: Path, cache_dir: Path) -> None:
    summary = build(recipes / "digits-torch", tmp_path / "build")
    assert outcomes(summary, "executed") == ALL_STAGES
    check = summary["checks"]["mcu"]
    assert check["ok"] and check["tolerance"] == "exact"
    metrics = summary["metrics"]["tune:c"]
    assert metrics["fp32"] > 0.9 and metrics["quantized"] > 0.9
    traced = Graph.load(tmp_path / "build" / "digits-torch" / "trace")
    assert [node.op for node in traced.nodes] == ["dense", "dense", "dense"]


def test_torch_and_numpy_digits_trace_to_the_same_graph(tmp_path: Path) -> None:
    """state.pt holds the numpy example's weights, so the two frontends must agree to the last bit."""
    graphs = []
    for name, source, weights, framework in (
        ("digits-torch", "model.py:build", "state.pt", "torch"),
        ("digits", "model.py:build", "weights.npz", "numpy"),
    ):
        spec = SimpleNamespace(framework=framework, source=f"{RECIPES / name / source}", weights=RECIPES / name / weights,
                               inputs={"x": [None, 64]})
        trace_stage(spec, tmp_path / name, Progress.silent())
        graphs.append(Graph.load(tmp_path / name))
    assert graphs[0].content_hash() == graphs[1].content_hash()


def test_trace_key_includes_the_torch_version(
    recipes: Path, tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    build(recipes / "digits-torch", tmp_path / "first")
    again = build(recipes / "digits-torch", tmp_path / "second")  # a new build dir: only the cache remembers
    assert outcomes(again, "restored from cache") == ALL_STAGES

    real_version = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.0.0" if name == "torch" else real_version(name))
    upgraded = build(recipes / "digits-torch", tmp_path / "third")
    assert "trace" in outcomes(upgraded, "executed")
    assert "calibrate" in outcomes(upgraded, "restored from cache")  # the retraced graph is the same graph


BROKEN_MODELS = '''

import torch


class Branchy(nn.Module):
    """torch.export cannot guard on the data; fx cannot branch on a proxy."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        if x.sum() > 0:
            return self.fc(x)
        return -self.fc(x)


class Floor(nn.Module):
    def forward(self, x):
        return torch.floor(x)


def branchy():
    return Branchy()


def floor():
    return Floor()
'''


@pytest.mark.parametrize(
    ("factory", "exit_code", "expected"),
    [
        ("branchy", 1, "Branchy (defined in {model}) with inputs x[?, 64] cannot be captured: torch.export failed"),
        ("floor", 2, "aten.floor (node floor, module <root> (Floor), at {model}:"),
    ],
)
def test_a_model_dabuild_cannot_trace_fails_the_build_and_leaves_nothing(
    recipes: Path, tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture,
    factory: str, exit_code: int, expected: str,
) -> None:
    folder = recipes / "digits-torch"
    model = folder / "model.py"
    model.write_text(model.read_text() + BROKEN_MODELS)
    recipe = (folder / "recipe.yaml").read_text()
    (folder / "recipe.yaml").write_text(recipe.replace("model.py:build", f"model.py:{factory}").replace("  weights: state.pt\n", ""))
    code = main(["build", str(folder), "--build-dir", str(tmp_path / "build"), "-q"])
    assert code == exit_code
    assert expected.format(model=model.resolve()) in capsys.readouterr().err
    assert not (tmp_path / "build" / "digits-torch" / "trace").exists()


NEW_OPS_MODEL = '''

import torch
from torch import nn
from torch.nn import functional as F


class NewOps(nn.Module):
    """PReLU, a transposed conv, nearest interpolation, a channel flip with maximum, elu: random weights."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.prelu = nn.PReLU(8)
        self.up = nn.ConvTranspose2d(8, 4, 2, stride=2)
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        y = F.max_pool2d(self.prelu(self.conv(x.view(-1, 1, 8, 8))), 2)
        y = F.interpolate(self.up(y), scale_factor=0.5, mode="nearest")
        y = F.elu(torch.maximum(y, y.flip(1)))
        return self.head(y.flatten(1))


def new_ops():
    return NewOps()
'''


@pytest.mark.slow
def test_a_torch_model_of_the_new_ops_builds_and_checks_on_c_onnx_and_nnef(
    recipes: Path, tmp_path: Path, cache_dir: Path,
) -> None:
    """trace -> calibrate -> tune -> export and check c (exact), onnx and nnef (approximate)."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("tract")
    folder = recipes / "digits-torch"
    (folder / "model.py").write_text((folder / "model.py").read_text() + NEW_OPS_MODEL)
    recipe = (folder / "recipe.yaml").read_text().replace("model.py:build", "model.py:new_ops")
    recipe = recipe.replace("  weights: state.pt\n", "").replace("tolerable_loss: 0.01", "tolerable_loss: 0.5")
    recipe += "  - {name: ort, kind: onnx}\n  - {name: tract, kind: nnef}\n"
    (folder / "recipe.yaml").write_text(recipe)
    summary = build(folder, tmp_path / "build")
    assert all(summary["checks"][name]["ok"] for name in ("mcu", "ort", "tract"))
    traced = Graph.load(tmp_path / "build" / "digits-torch" / "trace")
    assert {"prelu", "conv_transpose", "resize", "max", "elu"} <= {node.op for node in traced.nodes}
