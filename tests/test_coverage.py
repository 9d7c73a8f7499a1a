"""docs/ops.md (coverage table and op reference) is generated from the registries and kept current."""

from __future__ import annotations

from pathlib import Path

import pytest

from dabuild import coverage
from dabuild.errors import BuildError
from dabuild.ir.ops import OPS

DOCS = Path(__file__).resolve().parent.parent / "docs" / "ops.md"


@pytest.fixture(autouse=True)
def every_plugin_installed() -> None:
    """The page covers every installed target and frontend, so it can be built only with all their extras."""
    try:
        coverage.tables()
    except BuildError as missing:
        pytest.skip(f"an extra is missing, so the coverage table would lack its column: {missing}")


def test_docs_ops_md_is_current() -> None:
    text = DOCS.read_text(encoding="utf-8")
    assert text == coverage.page(), "docs/ops.md is stale: run `python -m dabuild.coverage > docs/ops.md`"
    for name in OPS:
        assert text.count(f"| `{name}` |") == 2  # a coverage row and a reference row


def test_every_converter_and_lowering_declares_what_it_makes() -> None:
    assert coverage.undeclared_converters() == []
    assert coverage.undeclared_lowerings() == []


def test_rows_follow_the_registries() -> None:
    rows = {row["op"]: row for row in coverage.rows()}
    assert set(rows) == set(OPS)
    assert rows["conv"]["c"] == "int + float" and rows["conv"]["onnx"] == "int + float"
    assert rows["div"]["integer lowering"] == "float island" and rows["div"]["c"] == "float"
    assert rows["div"]["hdl"] == "—"
    assert rows["softmax"]["hdl"] == "—"  # registered only to refuse, with the reason
    assert "Conv" in rows["conv"]["onnx frontend"] and "conv2d" in rows["conv"]["torch frontend"]


def test_an_undeclared_emit_is_refused_while_converting() -> None:
    onnx = pytest.importorskip("onnx")
    from onnx import helper

    from dabuild.trace.onnx_frontend.converters import CONVERTERS, Converter
    from dabuild.trace.onnx_frontend.tracer import OnnxTracer

    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    relu = CONVERTERS["Relu"]
    with CONVERTERS.without("Relu"):  # its real entry comes back on exit, replacing this one
        CONVERTERS.add("Relu", Converter(relu.convert, relu.static, ("sigmoid",)))
        with pytest.raises(BuildError, match="emits 'relu', which it does not declare"):
            OnnxTracer(model).trace()


TOY_TARGET = '''
from dabuild.targets.base import Target


class ToyTarget(Target):
    kind = "toy"
    capability = "c"
    default_tolerance = "exact"

    @classmethod
    def layer_types(cls):
        return frozenset({"relu", "dense", "lookup"})

    @classmethod
    def float_ops(cls):
        return frozenset({"div"})
'''


@pytest.fixture
def toy_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A third-party target plugin, installed as one is: a module and a dist-info naming it in dabuild.targets."""
    from dabuild import plugins

    (tmp_path / "toy_target.py").write_text(TOY_TARGET)
    info = tmp_path / "toy_target-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-target\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[dabuild.targets]\ntoy = toy_target:ToyTarget\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    plugins._entry_points.cache_clear()
    yield
    monkeypatch.undo()
    plugins._entry_points.cache_clear()


def test_a_new_target_plugin_appears_in_the_coverage_table(toy_target: None) -> None:
    rows = {row["op"]: row for row in coverage.rows()}
    assert rows["relu"]["toy"] == "int"          # its lowering's one layer type, relu, is in the toy's table
    assert rows["conv"]["toy"] == "int except conv"  # conv lowers to conv and lookup; the toy writes only lookup
    assert rows["div"]["toy"] == "float" and rows["softmax"]["toy"] == "—"
    header = coverage.coverage_markdown().splitlines()[coverage.HEADER.count("\n")]
    assert "| c | hdl | nnef | onnx | tflite | toy |" in header
