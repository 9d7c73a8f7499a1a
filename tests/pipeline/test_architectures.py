"""The classic architecture families (tests/architectures.py) as users have them: written in torch, exported to
ONNX with the batch fixed to 1 at an old opset (below 9 where the exporter allows, else brought down with onnx's
version converter when it can) and at a new one, traced by both frontends and compared with onnxruntime and torch,
then built end to end (trace, calibrate, tune, export c/onnx/nnef, check) on small inputs with random weights.

A family that needs an op some frontend or stage does not have yet is skipped naming the op, decided at run time
from the registries, so it runs as soon as the op lands.
"""

from __future__ import annotations

import io
import json
import re
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from architectures import FAMILIES, Family, build  # noqa: E402

from dabuild.cli import main  # noqa: E402
from dabuild.errors import UsageError  # noqa: E402
from dabuild.ir import Graph  # noqa: E402
from dabuild.ir.interpreter import run  # noqa: E402
from dabuild.ir.passes import optimize  # noqa: E402
from dabuild.trace import trace_model  # noqa: E402
from dabuild.trace.onnx_frontend.converters import CONVERTERS as ONNX_CONVERTERS  # noqa: E402
from dabuild.trace.torch_frontend.aten import CONVERTERS as ATEN_CONVERTERS  # noqa: E402

OLD, NEW = 8, 17
RELATIVE = 1e-4
SAMPLES = 3
IDS = [family.name for family in FAMILIES]


def export(model: torch.nn.Module, side: int, opset: int) -> onnx.ModelProto:
    """torch.onnx's TorchScript exporter with a fixed batch of 1, as published files have it."""
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, torch.zeros(1, 3, side, side), buffer, opset_version=opset, dynamo=False)
    return onnx.load_from_string(buffer.getvalue())


def export_old(model: torch.nn.Module, side: int) -> onnx.ModelProto:
    """Opset OLD if the exporter writes it; else the oldest it writes, brought down to OLD by onnx's version
    converter when that works (it has no adapter for some newer ops), else left at the oldest."""
    for opset in range(OLD, NEW + 1):
        try:
            exported = export(model, side, opset)
        except Exception:  # noqa: BLE001, S112 - torch.onnx: the op has no symbolic at this opset
            continue
        if opset == OLD:
            return exported
        try:
            lowered = onnx.version_converter.convert_version(exported, OLD)
            onnx.checker.check_model(lowered)
            return lowered
        except Exception:  # noqa: BLE001 - no adapter for an op: keep the file at the oldest opset it has
            return exported
    raise AssertionError(f"torch.onnx exports {model.__class__.__name__} at no opset from {OLD} to {NEW}")


def images(family: Family, count: int = SAMPLES, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(count, 3, family.side, family.side)).astype(np.float32)


def skip_if_missing(trace: Callable[[], Graph], frontend: str) -> Graph:
    """The traced graph; a skip naming the ops when tracing fails only for ops the frontend's registry lacks."""
    try:
        return trace()
    except UsageError as error:
        lines = str(error).splitlines()
        if frontend == "onnx":
            listed = [re.match(r"\s+node '.*' \(([^)]+)\): ", line) for line in lines[1:]]
            names = [match[1] for match in listed if match]
            missing = [name for name in names if name not in ONNX_CONVERTERS]
        else:
            names = [match[1] for match in (re.match(r"\s+aten\.(\w+) \(", line) for line in lines[1:]) if match]
            missing = [name for name in names if name not in ATEN_CONVERTERS]
        if names and len(missing) == len(names):
            pytest.skip(f"the {frontend} frontend has no converter for {', '.join(sorted(set(missing)))} yet")
        raise


def assert_close(got: np.ndarray, want: np.ndarray) -> None:
    """Within RELATIVE of the reference's largest magnitude (outputs near zero make elementwise ratios noise)."""
    error = float(np.max(np.abs(got - want))) / max(float(np.max(np.abs(want))), 1e-12)
    assert got.shape == want.shape and error <= RELATIVE, f"max relative error {error:.3g} > {RELATIVE}"


def reference_outputs(exported: onnx.ModelProto, model: torch.nn.Module, x: np.ndarray) -> np.ndarray:
    """The file's outputs in onnxruntime, sample by sample (its batch is fixed to 1); the torch module's where
    onnxruntime refuses the file itself (torch's old-opset export of a ceil-mode pool pads past the kernel)."""
    try:
        session = ort.InferenceSession(exported.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as error:  # noqa: BLE001 - onnxruntime's own load errors have no common public type
        assert "Pad should be smaller than kernel" in str(error), error
        with torch.no_grad():
            return model(torch.from_numpy(x)).numpy()
    name = session.get_inputs()[0].name
    return np.concatenate([session.run(None, {name: x[i:i + 1]})[0] for i in range(len(x))])


@pytest.mark.parametrize("opset", ["old", "new"])
@pytest.mark.parametrize("family", FAMILIES, ids=IDS)
def test_onnx_frontend_matches_onnxruntime(family: Family, opset: str) -> None:
    model = build(family)
    exported = export_old(model, family.side) if opset == "old" else export(model, family.side, NEW)
    graph = skip_if_missing(lambda: optimize(trace_model(exported)), "onnx")
    assert graph.inputs[0].shape[0] is None, "the file's fixed batch of 1 should relax"
    x = images(family)
    assert_close(run(graph, {graph.inputs[0].name: x})[graph.outputs[0]], reference_outputs(exported, model, x))


@pytest.mark.parametrize("family", FAMILIES, ids=IDS)
def test_torch_frontend_matches_torch(family: Family) -> None:
    model = build(family)
    shape = (None, 3, family.side, family.side)
    graph = skip_if_missing(lambda: optimize(trace_model(model, "torch", {"x": shape})), "torch")
    x = images(family)
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    assert_close(run(graph, {graph.inputs[0].name: x})[graph.outputs[0]], want)


RECIPE = """name: {name}
model: {{source: model.onnx}}
data:
  calibration: {{source: data.npz, x: x, samples: 32, batch_size: 16}}
  evaluation: {{source: data.npz, x: x, y: y}}
  metric: accuracy
tuning: {{strategy: basic, max_trials: 2, allow_miss: true, objective: bops}}  # random weights: the build, not the accuracy
  # or the objective, is tested (bops is counted; pricing each config by its exported artifact takes longer)
targets:
{targets}"""
TARGETS = {"c": "  - {name: c, kind: c}\n", "onnx": "  - {name: ort, kind: onnx}\n",
           "nnef": "  - {name: tract, kind: nnef}\n"}


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES, ids=IDS)
def test_builds_end_to_end_from_the_old_opset_file(family: Family, tmp_path: Path, cache_dir: Path) -> None:
    """trace -> calibrate -> tune -> export c/onnx/nnef -> check, each check at its target's default tolerance.

    The c target runs integers only: a graph with ops that have no integer lowering (float islands) builds for
    onnx and nnef, whose capabilities allow islands."""
    from dabuild.quant.lowering import LOWERINGS

    model = build(family)
    exported = export_old(model, family.side)
    graph = skip_if_missing(lambda: trace_model(exported), "onnx")
    onnx.save(exported, tmp_path / "model.onnx")
    x = images(family, 48, seed=1)
    with torch.no_grad():
        y = model(torch.from_numpy(x)).numpy().argmax(1)
    np.savez(tmp_path / "data.npz", x=x, y=y)
    integer = all(node.op in LOWERINGS for node in optimize(graph).nodes)
    kinds = ["c", "onnx", "nnef"] if integer else ["onnx", "nnef"]
    (tmp_path / "recipe.yaml").write_text(RECIPE.format(name=family.name.replace("_", "-"),
                                                        targets="".join(TARGETS[kind] for kind in kinds)))
    assert main(["build", str(tmp_path), "--build-dir", str(tmp_path / "build"), "-q"]) == 0
    summary = json.loads((tmp_path / "build" / family.name.replace("_", "-") / "build.json").read_text())
    assert len(summary["checks"]) == len(kinds) and all(check["ok"] for check in summary["checks"].values())
