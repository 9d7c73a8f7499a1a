"""Integer graph inputs (token ids) indexing a constant table: a small text classifier (embedding, mean over the
tokens or flatten, dense, classes), exported to ONNX with a fixed batch of 1 as published files have it and taken
as a torch module, traced, calibrated, tuned, exported to c, onnx and nnef and checked at each target's default
tolerance; bad token data and ops that read the ids are refused with the recipe line, node and op."""

from __future__ import annotations

import io
import json
import re
import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from dabuild.cli import main  # noqa: E402
from dabuild.errors import BuildError, UsageError  # noqa: E402
from dabuild.ir.interpreter import run  # noqa: E402
from dabuild.ir.passes import optimize  # noqa: E402
from dabuild.progress import Progress  # noqa: E402
from dabuild.qir.reference import quantize_input, run_integer  # noqa: E402
from dabuild.quant.calibrate import calibrate  # noqa: E402
from dabuild.quant.config import NodeConfig, QuantChoice, QuantConfig  # noqa: E402
from dabuild.quant.quantize import quantize  # noqa: E402
from dabuild.trace import trace_model  # noqa: E402

VOCAB, TOKENS, WIDTH, CLASSES = 30, 8, 12, 4
IR_VERSION = 7  # what exporters of 2020-2021 wrote; the file states it explicitly
MODEL_PY = f"""import torch

class TextClassifier(torch.nn.Module):
    def __init__(self, flatten):
        super().__init__()
        self.flatten = flatten
        self.embed = torch.nn.Embedding({VOCAB}, {WIDTH})
        self.dense = torch.nn.Linear({WIDTH * TOKENS} if flatten else {WIDTH}, {CLASSES})

    def forward(self, ids):
        rows = self.embed(ids)
        return self.dense(rows.flatten(1) if self.flatten else rows.mean(dim=1))

def build(flatten=False):
    torch.manual_seed(0)
    return TextClassifier(flatten).eval()

pooled = build()
flattened = build(True)
"""


def classifier(folder: Path, flatten: bool = False) -> torch.nn.Module:
    """The model of MODEL_PY, written to folder/model.py so a recipe can name it too."""
    (folder / "model.py").write_text(MODEL_PY)
    namespace: dict = {}
    exec(compile(MODEL_PY, str(folder / "model.py"), "exec"), namespace)
    return namespace["build"](flatten)


def export(model: torch.nn.Module) -> onnx.ModelProto:
    """torch.onnx's TorchScript exporter with the batch fixed to 1 and int64 ids, ir_version set explicitly."""
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.zeros(1, TOKENS, dtype=torch.long),), buffer, input_names=["ids"],
                          opset_version=13, dynamo=False)
    exported = onnx.load_from_string(buffer.getvalue())
    exported.ir_version = IR_VERSION
    return exported


def token_ids(count: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, VOCAB, (count, TOKENS), dtype=np.int64)


def torch_outputs(model: torch.nn.Module, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(ids)).numpy()


@pytest.mark.parametrize("flatten", [False, True], ids=["mean", "flatten"])
def test_both_frontends_trace_the_ids_as_an_integer_input(tmp_path: Path, flatten: bool) -> None:
    model = classifier(tmp_path, flatten)
    ids = token_ids(5)
    want = torch_outputs(model, ids)
    exported = export(model)
    session = ort.InferenceSession(exported.SerializeToString(), providers=["CPUExecutionProvider"])
    runtime = np.concatenate([session.run(None, {"ids": ids[i:i + 1]})[0] for i in range(len(ids))])
    np.testing.assert_allclose(runtime, want, rtol=1e-4, atol=1e-5)
    traced = {"onnx": optimize(trace_model(exported)),
              "torch": optimize(trace_model(model, "torch", {"ids": (1, TOKENS)}, dtypes={"ids": "int64"}))}
    for frontend, graph in traced.items():
        assert [(spec.shape, spec.dtype) for spec in graph.inputs] == [((None, TOKENS), "int64")], frontend
        assert graph.nodes[0].op == "embedding", frontend
        got = run(graph, {"ids": ids})[graph.outputs[0]]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=frontend)


@pytest.mark.parametrize("granularity", ["per_tensor", "per_channel"])
def test_the_integer_reference_indexes_the_quantized_table(tmp_path: Path, granularity: str) -> None:
    """Per tensor the output is the table's own integers at the ids; per row, each row requantized to the output's
    params lands within one output step of the real row. The ids stay integers, and a bad one is refused."""
    model = classifier(tmp_path)
    graph = optimize(trace_model(export(model)))
    ids = token_ids(16)
    stats = calibrate(graph, [{"ids": ids}], Progress.silent())
    assert "ids" not in stats.ranges, "integer inputs are not quantized, so they get no histograms"
    activation = QuantChoice("int8", "asym", "per_tensor", "minmax")
    config = QuantConfig({node.name: NodeConfig(QuantChoice("int8", "sym", granularity, "minmax"), activation)
                          for node in graph.nodes})
    qgraph = quantize(graph, stats, config)
    assert qgraph.takes_indices and quantize_input(qgraph, ids).dtype == np.int32
    embedding = qgraph.layers[0]
    assert embedding.op == "embedding" and embedding.weight.dtype == np.int8
    values = run_integer(qgraph, quantize_input(qgraph, ids), keep_intermediates=True)
    rows = values[embedding.outputs[0]]
    params = qgraph.tensors[embedding.outputs[0]].params
    table = graph.constants[graph.nodes[0].inputs[1]]
    if granularity == "per_tensor":
        np.testing.assert_array_equal(rows, embedding.weight[ids])
        assert params.scale == embedding.weight_scale[0]
    else:
        assert len(embedding.weight_scale) == VOCAB
    assert np.abs(params.dequantize(rows) - table[ids]).max() <= params.scale * (1 + (granularity == "per_channel"))
    bad = ids.copy()
    bad[3, 2] = VOCAB
    with pytest.raises(BuildError, match=rf"embedding.*first {VOCAB} at position \[3, 2\]"):
        run_integer(qgraph, quantize_input(qgraph, bad))


RECIPE = """name: tokens
model: {model}
data:
  calibration: {{source: data.npz, x: ids, samples: 32, batch_size: 16}}
  evaluation: {{source: data.npz, x: ids, y: y}}
tuning: {{strategy: basic, max_trials: 2, allow_miss: true{space}}}   # random weights: the build is tested
targets:
{targets}"""
TARGETS = {"c": "  - {name: c, kind: c}\n", "onnx": "  - {name: ort, kind: onnx}\n",
           "nnef": "  - {name: tract, kind: nnef}\n", "hdl": "  - {name: fpga, kind: hdl}\n"}
PER_ROW = ", space: {op_type: {embedding: {weight: {granularity: [per_channel]}}}}"


def write_recipe(folder: Path, source: str, targets: list[str], ids: np.ndarray | None = None,
                 per_row: bool = False, flatten: bool = False) -> None:
    """The model as an ONNX file or a torch module, token data labelled by the model itself, and the recipe."""
    model = classifier(folder, flatten)
    if source == "onnx":
        onnx.save(export(model), folder / "model.onnx")
        spec = "{source: model.onnx}"
    else:
        spec = (f"{{source: 'model.py:{'flattened' if flatten else 'pooled'}', "
                f"inputs: {{ids: {{shape: [1, {TOKENS}], dtype: int64}}}}}}")
    ids = token_ids(48, seed=1) if ids is None else ids
    np.savez(folder / "data.npz", ids=ids, y=torch_outputs(model, np.clip(ids, 0, VOCAB - 1).astype(np.int64)).argmax(1))
    (folder / "recipe.yaml").write_text(RECIPE.format(model=spec, space=PER_ROW if per_row else "",
                                                      targets="".join(TARGETS[kind] for kind in targets)))


@pytest.mark.parametrize(("source", "per_row", "flatten"),
                         [("onnx", False, False), ("torch", True, False), ("torch", False, True)],
                         ids=["onnx-per-tensor", "torch-per-row", "torch-flatten"])
def test_builds_end_to_end_with_every_check_passing(tmp_path: Path, cache_dir: Path, source: str, per_row: bool,
                                                    flatten: bool) -> None:
    pytest.importorskip("tract")
    write_recipe(tmp_path, source, ["c", "onnx", "nnef"], per_row=per_row, flatten=flatten)
    assert main(["build", str(tmp_path), "--build-dir", str(tmp_path / "build"), "-q"]) == 0
    build = tmp_path / "build" / "tokens"
    summary = json.loads((build / "build.json").read_text())
    assert len(summary["checks"]) == 3 and all(check["ok"] for check in summary["checks"].values())
    exported = onnx.load(str(build / "export-ort" / "model.onnx"))
    assert exported.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.INT64
    gathers = [node for node in exported.graph.node if node.op_type == "Gather"]
    assert len(gathers) == 1 and gathers[0].input[1] == "ids"
    assert "model_input_t in[MODEL_INPUT_SIZE]" in (build / "export-c" / "main.c").read_text()
    assert "typedef int32_t model_input_t;" in (build / "export-c" / "model.h").read_text()


def test_the_c_artifact_refuses_an_index_outside_its_table(tmp_path: Path, cache_dir: Path) -> None:
    """model_forward returns -2 for a bad index (no read outside the table); the test program stops there."""
    from dabuild.plugins import TARGETS as TARGET_PLUGINS
    from dabuild.plugins import load
    from dabuild.qir.qgraph import QGraph

    write_recipe(tmp_path, "onnx", ["c"])
    assert main(["build", str(tmp_path), "--build-dir", str(tmp_path / "build"), "-q"]) == 0
    build = tmp_path / "build" / "tokens"
    target_class = load(TARGET_PLUGINS, "c")
    target = target_class(target_class.Options())
    qgraph = QGraph.load(build / "tune-c" / "qgraph")
    ids = quantize_input(qgraph, token_ids(3))
    work = tmp_path / "work"
    work.mkdir()
    np.testing.assert_array_equal(target.run(build / "export-c", ids, work), run_integer(qgraph, ids))
    ids[1, 0] = -1
    with pytest.raises(BuildError, match="failed at sample 1"):
        target.run(build / "export-c", ids, work)


def test_hdl_refuses_the_embedding_naming_node_op_and_target(tmp_path: Path, cache_dir: Path,
                                                             capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("da4ml")
    write_recipe(tmp_path, "onnx", ["hdl"])
    assert main(["build", str(tmp_path), "--build-dir", str(tmp_path / "build"), "-q"]) == 1
    err = capsys.readouterr().err
    assert "'/embed/Gather' (embedding)" in err and "hdl target" in err and "Traceback" not in err


def one_bad_id() -> np.ndarray:
    ids = token_ids(48)
    ids[5, 3] = VOCAB
    return ids


@pytest.mark.parametrize(("ids", "message"), [
    (one_bad_id(), (rf"recipe.yaml:4:\d+: array 'ids': indexes the table of node '/embed/Gather' \(embedding\): "
                    rf"1 index lies outside the table's rows 0..{VOCAB - 1}, the first {VOCAB} at position \[5, 3\]")),
    (token_ids(48).astype(np.float32), (r"recipe.yaml:4:\d+: .*holds float32 values, but model input 'ids' takes "
                                        "integers")),
], ids=["out-of-range", "float-ids"])
def test_bad_token_data_is_a_validation_error_at_the_recipe_line(tmp_path: Path, cache_dir: Path, ids: np.ndarray,
                                                                 message: str, capsys: pytest.CaptureFixture) -> None:
    write_recipe(tmp_path, "onnx", ["c"], ids=ids)
    assert main(["build", str(tmp_path), "--build-dir", str(tmp_path / "build"), "-q"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert any(re.search(message, line) for line in err.splitlines()), err


def test_a_recipe_input_dtype_outside_the_choices_names_its_line(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture) -> None:
    write_recipe(tmp_path, "torch", ["c"])
    text = (tmp_path / "recipe.yaml").read_text().replace("dtype: int64", "dtype: int16")
    (tmp_path / "recipe.yaml").write_text(text)
    assert main(["validate", str(tmp_path / "recipe.yaml")]) == 2
    err = capsys.readouterr().err
    assert "recipe.yaml:2:" in err and "int64" in err and "int16" in err


def test_an_integer_input_read_by_another_op_is_refused() -> None:
    """Token ids that a node computes with (a Gather of the ids themselves here) are no index: one error naming the
    node and the input."""
    from onnx import TensorProto, helper

    picks = helper.make_tensor("picks", TensorProto.INT64, [2], [0, 3])
    graph = helper.make_graph(
        [helper.make_node("Gather", ["ids", "picks"], ["y"], axis=1, name="pick")], "reads_ids",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, TOKENS])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, [1, 2])], initializer=[picks])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = IR_VERSION
    with pytest.raises(UsageError, match=r"node 'pick\w*' \(gather\) reads the integer input 'ids'.*may only index "
                                         "an embedding table"):
        trace_model(model)


def test_an_input_declared_integer_must_be_one_in_the_model() -> None:
    """model.inputs saying int64 for an input the file takes as float is refused, not traced as something else."""
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "float_input",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, TOKENS])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, TOKENS])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = IR_VERSION
    with pytest.raises(UsageError, match=r"model.inputs declares input 'x' as int64, but the model takes float32"):
        trace_model(model, dtypes={"x": "int64"})
