"""The onnx target on 16x8 QGraphs (from the committed 16x8 .tflite files): QDQ with int16 QuantizeLinear and
DequantizeLinear at opset 21, run by onnxruntime and checked at its tolerance; an opset below 21 is refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the onnx extra is not installed")
pytest.importorskip("onnxruntime", reason="the onnx extra is not installed")
pytest.importorskip("tflite_micro", reason="needs the tflite extra: pip install 'dabuild[tflite]'")

from tflite_runtime import given_qgraph, inputs_for, model  # noqa: E402

from dabuild.errors import BuildError  # noqa: E402
from dabuild.progress import Progress  # noqa: E402
from dabuild.targets.check import check_stage  # noqa: E402
from dabuild.targets.onnx import MODEL_FILE, OnnxTarget  # noqa: E402
from dabuild.targets.onnx.qdq import to_qdq_onnx  # noqa: E402


@pytest.mark.parametrize("name", ["resnet_block_16x8", "ds_cnn_16x8"])
def test_16x8_qdq_runs_in_onnxruntime_within_tolerance(name: str, tmp_path: Path) -> None:
    path = model(name)
    _, qgraph = given_qgraph(path, "onnxruntime")
    target = OnnxTarget()
    artifact = tmp_path / "artifact"
    artifact.mkdir()
    target.export(qgraph, artifact)
    written = onnx.load(str(artifact / MODEL_FILE))
    assert max(entry.version for entry in written.opset_import if entry.domain in ("", "ai.onnx")) >= 21
    zero_points = [init for init in written.graph.initializer if init.name.endswith("/zero_point")]
    assert any(init.data_type == onnx.TensorProto.INT16 for init in zero_points)
    x = inputs_for(path, 12, seed=4)
    report = check_stage(target, qgraph, artifact, x, None, tmp_path, tmp_path / "debug", Progress.silent())
    assert report["ok"] and report["tolerance"] == "approximate"
    assert report["max_abs_err"] <= 2 * qgraph.output_params.scale   # within two int16 steps
    assert np.isfinite(report["max_abs_err"])


def test_16x8_at_an_opset_without_int16_is_refused_naming_the_layer() -> None:
    _, qgraph = given_qgraph(model("resnet_block_16x8"), "onnxruntime")
    with pytest.raises(BuildError, match=r"layer 'op0_quantize:transpose' has int16 activations.*opset 21"):
        to_qdq_onnx(qgraph, opset=17)


def test_a_mixed_8_16_config_runs_in_onnxruntime_within_tolerance(tmp_path: Path) -> None:
    """int16 on one dense of an MLP, int8 elsewhere (what the tuner picks in test_tune_16bit): each tensor's
    QuantizeLinear/DequantizeLinear pair has its own type, checked at onnxruntime's tolerance."""
    import dataclasses

    from test_tune_16bit import outlier_mlp

    from dabuild.capability import load_capability
    from dabuild.quant.calibrate import Stats
    from dabuild.quant.config import QuantConfig
    from dabuild.quant.defaults import default_config
    from dabuild.quant.quantize import quantize
    from dabuild.resources import data_dir

    _, graph = outlier_mlp(tmp_path)
    config = default_config(graph, load_capability(data_dir("capabilities") / "onnxruntime.yaml"))
    fc1 = config.nodes["fc1"]
    assert fc1.activation is not None
    mixed = QuantConfig({**config.nodes, "fc1": dataclasses.replace(
        fc1, activation=dataclasses.replace(fc1.activation, dtype="int16", scheme="sym"))})
    qgraph = quantize(graph, Stats.load(tmp_path / "stats"), mixed)
    assert {tensor.params.dtype for tensor in qgraph.tensors.values()} == {"int8", "int16"}
    target = OnnxTarget()
    artifact = tmp_path / "artifact"
    artifact.mkdir()
    target.export(qgraph, artifact)
    x = np.random.default_rng(6).normal(size=(32, 16)).astype(np.float32)
    report = check_stage(target, qgraph, artifact, x, None, tmp_path, tmp_path / "debug", Progress.silent())
    assert report["ok"] and report["tolerance"] == "approximate"
