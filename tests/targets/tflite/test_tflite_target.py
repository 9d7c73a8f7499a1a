"""The tflite target: .tflite files written from QGraphs, run in TFLite Micro's interpreter (and LiteRT).

Round trips: each committed int8 and 16x8 .tflite rebuilt as given and written again runs in TFLM to the
very integers the original file runs to, and to the integer reference's; a CNN of our own, quantized by
dabuild, is exact in TFLM through `check`, whose report gives TFLM's arena. What TFLite cannot express is
refused listing every layer, exit 2.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tflite_micro", reason="needs the tflite extra: pip install 'dabuild[tflite]'")
pytest.importorskip("ai_edge_litert", reason="needs the tflite extra: pip install 'dabuild[tflite]'")

from test_c_kernels import conv_node, small_cnn
from test_lowering import graph_of, image, lower
from tflite_runtime import given_qgraph, inputs_for, model, run_tflm, trace_of_operator

from dabuild.capability import load_capability
from dabuild.errors import UsageError
from dabuild.ir.graph import Node
from dabuild.progress import Progress
from dabuild.qir.reference import quantize_input, run_integer
from dabuild.quant.defaults import default_config
from dabuild.quant.lowering import integer_forms
from dabuild.resources import data_dir
from dabuild.targets.check import check_stage
from dabuild.targets.tflite import MODEL_FILE, TfliteTarget
from dabuild.targets.tflite.runtime import run_tflm as run_file

ROUND_TRIPS = ["ds_cnn_int8", "resnet_block_int8", "resnet_block_16x8", "ds_cnn_16x8", "assorted_int8"]


def exported(target: TfliteTarget, qgraph, folder: Path) -> Path:
    artifact = folder / "artifact"
    artifact.mkdir(parents=True)
    target.export(target.integer_graph(qgraph), artifact)
    return artifact


def tflm_and_reference(graph, x: np.ndarray, folder: Path) -> tuple[np.ndarray, np.ndarray]:
    """`graph` quantized by dabuild on `x` for the tflite capability and exported: TFLM's outputs of the file (in
    the reference's shape) and the reference's integers, on `x` quantized."""
    capability = load_capability(data_dir("capabilities") / "tflite.yaml")
    qgraph = lower(graph, x, default_config(graph, capability))
    target = TfliteTarget()
    artifact = exported(target, qgraph, folder)
    x_q = quantize_input(qgraph, x)
    expected = run_integer(target.integer_graph(qgraph), x_q)
    return run_file(artifact / MODEL_FILE, x_q).reshape(expected.shape), expected


@pytest.mark.parametrize("name", ROUND_TRIPS)
def test_committed_file_rebuilt_as_given_runs_to_the_originals_integers(name: str, tmp_path: Path) -> None:
    path = model(name)
    _, qgraph = given_qgraph(path)
    x = inputs_for(path, 24, seed=11)
    target = TfliteTarget()
    assert target.rounding == "tflm"   # the capability's default
    artifact = exported(target, qgraph, tmp_path)
    x_q = quantize_input(qgraph, x)
    ours = target.run(artifact, x_q, tmp_path)
    original = run_tflm(path, qgraph, x)["output"]
    assert np.array_equal(ours.reshape(original.shape), original)
    reference = run_integer(target.integer_graph(qgraph), x_q)
    assert np.array_equal(ours, reference.reshape(ours.shape))
    assert target.litert["samples"] == len(x)   # LiteRT ran too, within a step of TFLM
    assert (artifact / MODEL_FILE).stat().st_size < path.stat().st_size


@pytest.mark.parametrize("name", ["ds_cnn_int8", "resnet_block_16x8"])
def test_float_io_file_takes_and_returns_float_and_runs_to_the_originals_integers(name: str, tmp_path: Path) -> None:
    """Option float_io: a QUANTIZE after the float32 input and a DEQUANTIZE before the float32 output, as
    TensorFlow's converter writes by default; TFLM then gives the original's outputs, dequantized, and the
    check (on the quantized integers) passes at exact with LiteRT run too."""
    from dabuild.trace.tflite_frontend import operator_names
    from dabuild.trace.tflite_frontend.model_file import read_model

    path = model(name)
    _, qgraph = given_qgraph(path)
    target = TfliteTarget(TfliteTarget.Options(float_io=True))
    artifact = exported(target, qgraph, tmp_path)
    names = operator_names(read_model(artifact / MODEL_FILE))
    assert names[0] == "QUANTIZE" and names[-1] == "DEQUANTIZE"
    x = inputs_for(path, 12, seed=9)
    graph = target.integer_graph(qgraph)
    floats = run_file(artifact / MODEL_FILE, graph.input_params.dequantize(quantize_input(qgraph, x)))
    assert floats.dtype == np.float32
    original = run_tflm(path, qgraph, x)["output"]
    assert np.array_equal(graph.output_params.dequantize(original.reshape(floats.shape)), floats)
    report = check_stage(target, graph, artifact, x, None, tmp_path, tmp_path / "debug", Progress.silent())
    assert report["ok"] and report["tolerance"] == "exact" and target.litert["samples"] == len(x)


def test_every_tensor_of_the_assorted_file_in_tflm_equals_the_targets_reference() -> None:
    """PAD, CONV_2D, TRANSPOSE_CONV (per-channel weights), STRIDED_SLICE, TANH, QUANTIZE, LOGISTIC, MUL,
    CONCATENATION, HARD_SWISH, RESHAPE, FULLY_CONNECTED of the original file, each operator's output in TFLM
    against the reference of the QGraph as the tflite target computes it (TFLM's rounding and functions)."""
    from dabuild.trace.tflite_frontend.model_file import read_model

    path = model("assorted_int8")
    operators = read_model(path).subgraphs[0].operators
    _, qgraph = given_qgraph(path)
    x = inputs_for(path, 16, seed=11)
    theirs = run_tflm(path, qgraph, x, tuple(int(op.outputs[0]) for op in operators))
    trace = run_integer(TfliteTarget().integer_graph(qgraph), quantize_input(qgraph, x), keep_intermediates=True)
    for index, op in enumerate(operators):
        expected = theirs[int(op.outputs[0])]
        assert np.array_equal(trace_of_operator(trace, index).reshape(expected.shape), expected), index


def test_ops_without_a_writer_are_refused_by_node_before_calibration() -> None:
    graph = graph_of([Node("s", "sigmoid", ["x"], ["a"], {}), Node("g", "gelu", ["a"], ["b"], {}),
                      Node("e", "exp", ["b"], ["y"], {})], (8,), {})
    with pytest.raises(UsageError, match=r"target 'tflite' cannot build.*\n  gelu: .*lookup \(gelu\).*"
                                         r"'g'\n  exp: .*lookup \(exp\).*'e'$") as caught:
        TfliteTarget().refuse(graph, integer_forms())
    assert caught.value.exit_code == 2


def test_convs_tflite_has_no_operator_for_are_refused_by_node_before_calibration() -> None:
    rng = np.random.default_rng(2)
    constants = {"g_w": rng.normal(0, 0.3, (8, 2, 3, 3)), "d_w": rng.normal(0, 0.3, (8, 1, 3, 3)),
                 "o_w": rng.normal(0, 0.3, (4, 8, 1, 1, 1))}
    nodes = [Node("r", "reshape", ["x"], ["img"], {"shape": [0, 4, 4, 4]}),
             conv_node("g", "img", "a", groups=2, pads=[1, 1, 1, 1]), conv_node("d", "a", "b", groups=8),
             Node("f", "reshape", ["b"], ["cube"], {"shape": [0, 8, 2, 2, 1]}), conv_node("o", "cube", "y")]
    graph = graph_of(nodes, (64,), constants)
    with pytest.raises(UsageError, match=r"\n  conv: its integer layers \(conv \(2 groups\)\) .*'g'\n  conv: "
                                         r"its integer layers \(conv \(3-D\)\) .*'o'$"):
        TfliteTarget().refuse(graph, integer_forms())


def one_d_chain(depthwise_pads: list[int]) -> object:
    """(N, C, L) rows through a depthwise k=3 conv (`depthwise_pads`), a pointwise conv with relu, a depthwise
    k=3 dilated conv and a dense after flatten: TensorFlow's Conv1D forms."""
    rng = np.random.default_rng(9)
    constants = {"d_w": rng.normal(0, 0.5, (6, 1, 3)), "d_b": rng.normal(0, 0.1, 6),
                 "p_w": rng.normal(0, 0.4, (8, 6, 1)), "p_b": rng.normal(0, 0.1, 8),
                 "e_w": rng.normal(0, 0.5, (8, 1, 3)), "e_b": rng.normal(0, 0.1, 8),
                 "w": rng.normal(0, 0.2, (8 * (12 + sum(depthwise_pads) - 2 - 4), 5)), "b": rng.normal(0, 0.1, 5)}
    nodes = [Node("r", "reshape", ["x"], ["rows"], {"shape": [0, 6, 12]}),
             conv_node("d", "rows", "a", groups=6, pads=depthwise_pads),
             conv_node("p", "a", "h", activation="relu"),
             conv_node("e", "h", "c", groups=8, dilations=[2]),
             Node("f", "flatten", ["c"], ["flat"], {}), Node("fc", "dense", ["flat", "w", "b"], ["y"], {})]
    return graph_of(nodes, (72,), constants)


@pytest.mark.parametrize("pads", [[0, 0], [1, 1], [2, 0]], ids=["valid", "same", "left"])
def test_one_d_convs_are_tflites_unit_height_convs_exact_in_tflm(pads: list[int], tmp_path: Path) -> None:
    """1-D depthwise and pointwise convs lie in the file as TensorFlow's converter writes a Conv1D (rows [1, 1,
    L, C], OHWI and 1HWO weights of unit height); one TRANSPOSE+RESHAPE back before the flatten; exact."""
    from dabuild.trace.tflite_frontend import operator_names
    from dabuild.trace.tflite_frontend.model_file import read_model

    graph = one_d_chain(pads)
    ours, expected = tflm_and_reference(graph, image(60, (72,), seed=4) * 2, tmp_path)
    assert np.array_equal(ours, expected)
    assert len(np.unique(expected)) > 30
    names = operator_names(read_model(tmp_path / "artifact" / MODEL_FILE))
    assert names.count("DEPTHWISE_CONV_2D") == 2 and names.count("CONV_2D") == 1
    assert names.count("TRANSPOSE") == 2   # the plain input to channels last, and back for the flatten


def test_elementwise_layers_between_one_d_convs_keep_the_unit_height_layout(tmp_path: Path) -> None:
    """An add of two 1-D convs' outputs and a mul by a per-channel constant stay on [1, 1, L, C] rows (the
    constant written there too): one TRANSPOSE in, one out, exact."""
    from dabuild.trace.tflite_frontend import operator_names
    from dabuild.trace.tflite_frontend.model_file import read_model

    rng = np.random.default_rng(12)
    constants = {"a_w": rng.normal(0, 0.5, (6, 1, 3)), "a_b": rng.normal(0, 0.1, 6),
                 "p_w": rng.normal(0, 0.4, (6, 6, 1)), "p_b": rng.normal(0, 0.1, 6),
                 "k": rng.uniform(0.5, 2, (6, 1)), "w": rng.normal(0, 0.2, (72, 4)), "b": rng.normal(0, 0.1, 4)}
    nodes = [Node("r", "reshape", ["x"], ["rows"], {"shape": [0, 6, 12]}),
             conv_node("a", "rows", "ha", groups=6, pads=[1, 1]), conv_node("p", "rows", "hp"),
             Node("s", "add", ["ha", "hp"], ["h"], {}), Node("m", "mul", ["h", "k"], ["g"], {}),
             Node("f", "flatten", ["g"], ["flat"], {}), Node("fc", "dense", ["flat", "w", "b"], ["y"], {})]
    ours, expected = tflm_and_reference(graph_of(nodes, (72,), constants), image(60, (72,), seed=6) * 2, tmp_path)
    assert np.array_equal(ours, expected)
    assert len(np.unique(expected)) > 30
    names = operator_names(read_model(tmp_path / "artifact" / MODEL_FILE))
    assert {"ADD", "MUL"} <= set(names) and names.count("TRANSPOSE") == 2


def test_streaming_wakeword_is_written_channels_last_throughout_and_exact_in_tflm(tmp_path: Path) -> None:
    """MLPerf Tiny's 1-D DS-TCN: eight 1-D convs on [1, 1, L, C] rows with no layout change between them; TFLM's
    outputs, and every tensor `trace` reads back from it, equal the reference's."""
    from mlperf_tiny import quantized

    from dabuild.trace.tflite_frontend import operator_names
    from dabuild.trace.tflite_frontend.model_file import read_model

    qgraph, data = quantized("wakeword")
    target = TfliteTarget(TfliteTarget.Options(litert=False))
    artifact = exported(target, qgraph, tmp_path)
    names = operator_names(read_model(artifact / MODEL_FILE))
    assert names.count("DEPTHWISE_CONV_2D") == 4 and names.count("CONV_2D") == 4 and names.count("TRANSPOSE") == 2
    graph = target.integer_graph(qgraph)
    x_q = quantize_input(qgraph, data[:8])
    expected = run_integer(graph, x_q, keep_intermediates=True)
    traced = target.trace(artifact, x_q, tmp_path)
    assert {name for name in traced if traced[name].ndim == 3} and traced.keys() <= expected.keys()
    for name, values in traced.items():
        assert np.array_equal(values, expected[name]), name
    assert np.array_equal(run_file(artifact / MODEL_FILE, x_q).reshape(expected[graph.output].shape),
                          expected[graph.output])


def tflite_cnn() -> object:
    """test_c_kernels' small CNN in TFLite's own forms: depthwise+relu6 with explicit pads, and a requantizing
    average pool padded as SAME pads it (after, not before)."""
    return small_cnn(depthwise_pads=(2, 0, 0, 2), pool_pads=(0, 0, 1, 1))


def test_a_cnn_quantized_by_dabuild_is_exact_in_tflm_through_check(tmp_path: Path) -> None:
    """float64 scales of dabuild's own become the file's float32 ones, and the reference follows TFLM's
    derivations from them: check passes at exact, and its report gives TFLM's arena and LiteRT's agreement."""
    graph = tflite_cnn()
    capability = load_capability(data_dir("capabilities") / "tflite.yaml")
    x = image(200, (64,), seed=8) * 2
    qgraph = lower(graph, x, default_config(graph, capability))
    target = TfliteTarget()
    artifact = exported(target, qgraph, tmp_path)
    report = check_stage(target, target.integer_graph(qgraph), artifact, x[:64], None, tmp_path,
                         tmp_path / "debug", Progress.silent())
    assert report["ok"] and report["tolerance"] == "exact" and report["mismatches"] == 0
    measured = report["firmware"]
    assert 0 < measured["tflm_arena_bytes"] < 64 * 1024
    assert measured["model_bytes"] == (artifact / MODEL_FILE).stat().st_size
    assert measured["litert_outputs_one_step_from_tflm"].endswith(f"of {64 * 10}")
    outputs = run_file(artifact / MODEL_FILE, quantize_input(qgraph, x[:8]))
    assert len(np.unique(outputs)) > 3   # real values, not one saturated constant


def test_int8_data_is_taken_as_the_integers_the_file_stores(tmp_path: Path) -> None:
    """A model quantizing its input first thing (the int8 DS-CNN) takes int8 data as its stored integers and
    float data as real values: the dtype decides; int16 data (another type) are real values too."""
    from tflite_runtime import imported

    from dabuild.data import DataFile, load_inputs

    path = model("ds_cnn_int8")
    graph, qgraph = given_qgraph(path)
    [name] = [spec.name for spec in graph.inputs]
    scale, zero_point, storage = imported(path).stored_inputs()[name]
    assert (np.float32(scale), zero_point, storage) == (np.float32(qgraph.input_params.scale), -2, "int8")
    x = inputs_for(path, 16, seed=2)
    stored = quantize_input(qgraph, x)
    np.savez(tmp_path / "data.npz", floats=x, int8=stored, int16=stored.astype(np.int16))
    spec = DataFile(tmp_path / "data.npz", "int8")
    taken = load_inputs(spec, [name], (), graph.stored_inputs())[name]
    assert np.array_equal(quantize_input(qgraph, taken), stored)
    for key, expected in (("floats", x), ("int16", stored.astype(np.float32))):
        spec = DataFile(tmp_path / "data.npz", key)
        assert np.array_equal(load_inputs(spec, [name], (), graph.stored_inputs())[name], expected)


def test_recipe_with_int8_data_builds_a_tflite_file_checked_exact(tmp_path: Path) -> None:
    """recipes/ds-cnn-tflite's tflite target, end to end through the CLI, its data given as the int8 the file
    stores: the check passes at exact and its report gives TFLM's arena."""
    import json

    import yaml
    from support import copy_recipes

    from dabuild.cli import main

    folder = copy_recipes(tmp_path, "ds-cnn-tflite") / "ds-cnn-tflite"
    _, qgraph = given_qgraph(model("ds_cnn_int8"))
    data = np.load(folder / "data.npz")
    np.savez(folder / "data.npz", x_train=quantize_input(qgraph, data["x_train"]),
             x_test=quantize_input(qgraph, data["x_test"]), y_test=data["y_test"])
    recipe = yaml.safe_load((folder / "recipe.yaml").read_text())
    recipe["targets"] = [target for target in recipe["targets"] if target["kind"] == "tflite"]
    recipe["model"]["source"] = str(model("ds_cnn_int8"))
    (folder / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    build = tmp_path / "build"
    assert main(["build", str(folder), "--build-dir", str(build), "-q"]) == 0
    [report_file] = build.glob("**/check-tflm/report.json") or build.glob("**/report.json")
    report = json.loads(report_file.read_text())
    assert report["ok"] and report["tolerance"] == "exact" and report["samples"] == 128
    assert report["firmware"]["tflm_arena_bytes"] > 0
    assert report["metric"]["artifact"] == report["metric"]["reference"] > 0.5


@pytest.mark.parametrize("scale", [0.02, 0.11])
def test_sigmoid_and_tanh_are_tflms_own_logistic_and_tanh(scale: float, tmp_path: Path) -> None:
    """dense -> sigmoid -> dense -> tanh quantized by dabuild (outputs at its own calibrated params): LOGISTIC and
    TANH at TFLite's fixed params, a QUANTIZE after each, exact in TFLM against the reference's TFLM tables."""
    rng = np.random.default_rng(1)
    constants = {"w": rng.normal(0, scale * 25, (8, 16)), "b": rng.normal(0, 0.1, 16),
                 "w2": rng.normal(0, 0.5, (16, 6)), "b2": rng.normal(0, 0.1, 6)}
    nodes = [Node("d", "dense", ["x", "w", "b"], ["h"], {}), Node("s", "sigmoid", ["h"], ["a"], {}),
             Node("d2", "dense", ["a", "w2", "b2"], ["h2"], {}), Node("t", "tanh", ["h2"], ["y"], {})]
    graph = graph_of(nodes, (8,), constants)
    ours, expected = tflm_and_reference(graph, image(300, (8,), seed=3) * 2, tmp_path)
    assert np.array_equal(ours, expected)
    assert len(np.unique(expected)) > 50


@pytest.mark.parametrize(("attrs", "kernel"), [({"strides": [2, 2]}, 2),
                                               ({"strides": [2, 2], "pads": [1, 1, 2, 2]}, 4)],
                         ids=["valid", "same"])
def test_transposed_conv_is_exact_in_tflm(attrs: dict, kernel: int, tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    constants = {"w": rng.normal(0, 0.5, (4, 6, kernel, kernel)), "b": rng.normal(0, 0.1, 6)}
    nodes = [Node("r", "reshape", ["x"], ["img"], {"shape": [0, 4, 5, 5]}),
             Node("t", "conv_transpose", ["img", "w", "b"], ["y"], attrs)]
    graph = graph_of(nodes, (100,), constants)
    ours, expected = tflm_and_reference(graph, image(40, (100,), seed=3) * 2, tmp_path)
    assert np.array_equal(ours, expected)


def test_transposed_conv_pads_tflite_cannot_crop_are_refused(tmp_path: Path) -> None:
    """Every such layer is listed, in one error, exit 2."""
    rng = np.random.default_rng(1)
    constants = {"w": rng.normal(0, 0.5, (4, 6, 3, 3)), "b": rng.normal(0, 0.1, 6),
                 "w2": rng.normal(0, 0.5, (6, 2, 3, 3)), "b2": rng.normal(0, 0.1, 2)}
    attrs = {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]}
    nodes = [Node("r", "reshape", ["x"], ["img"], {"shape": [0, 4, 5, 5]}),
             Node("t", "conv_transpose", ["img", "w", "b"], ["h"], attrs),
             Node("t2", "conv_transpose", ["h", "w2", "b2"], ["y"], attrs)]
    graph = graph_of(nodes, (100,), constants)
    capability = load_capability(data_dir("capabilities") / "tflite.yaml")
    qgraph = lower(graph, image(40, (100,), seed=3), default_config(graph, capability))
    with pytest.raises(UsageError, match=r"layers:\n  layer 't' \(conv_transpose\): pads \[1, 1, 1, 1\] are not what "
                                         r"TFLite crops.*\n  layer 't2' \(conv_transpose\)") as caught:
        exported(TfliteTarget(), qgraph, tmp_path)
    assert caught.value.exit_code == 2


def test_hard_swish_is_tflites_own_hard_swish(tmp_path: Path) -> None:
    """conv -> hard_swish quantized by dabuild: HARD_SWISH, exact in TFLM against TFLite's int16 fixed-point
    HardSwish in the reference."""
    rng = np.random.default_rng(4)
    constants = {"c_w": rng.normal(0, 0.6, (6, 2, 3, 3)), "c_b": rng.normal(0, 0.2, 6)}
    nodes = [Node("r", "reshape", ["x"], ["img"], {"shape": [0, 2, 6, 6]}),
             conv_node("c", "img", "h", pads=[1, 1, 1, 1]), Node("s", "hard_swish", ["h"], ["y"], {})]
    graph = graph_of(nodes, (72,), constants)
    ours, expected = tflm_and_reference(graph, image(60, (72,), seed=5) * 2, tmp_path)
    assert np.array_equal(ours, expected)
    assert len(np.unique(expected)) > 50


def test_dense_over_rows_of_rank_two_keeps_its_dimensions(tmp_path: Path) -> None:
    rng = np.random.default_rng(6)
    constants = {"w": rng.normal(0, 0.4, (8, 6)), "b": rng.normal(0, 0.1, 6)}
    nodes = [Node("r", "reshape", ["x"], ["rows"], {"shape": [0, 4, 8]}), Node("d", "dense", ["rows", "w", "b"], ["y"], {})]
    graph = graph_of(nodes, (32,), constants)
    capability = load_capability(data_dir("capabilities") / "tflite.yaml")
    x = image(50, (32,), seed=7)
    qgraph = lower(graph, x, default_config(graph, capability))
    target = TfliteTarget()
    artifact = exported(target, qgraph, tmp_path)
    x_q = quantize_input(qgraph, x)
    expected = run_integer(target.integer_graph(qgraph), x_q)
    assert expected.shape == (50, 4, 6)
    assert np.array_equal(target.run(artifact, x_q, tmp_path), expected)


def test_trace_gives_every_tensor_tflm_holds_and_a_wrong_file_fails_check_naming_its_layer(tmp_path: Path) -> None:
    """TFLM's values of every QGraph tensor the file holds equal the reference's; a file whose conv bias was
    changed after export fails check, the debug bundle naming that conv as the first diverging layer."""
    import flatbuffers

    from dabuild.errors import CheckError
    from dabuild.trace.tflite_frontend.model_file import read_model

    path = model("ds_cnn_int8")
    _, qgraph = given_qgraph(path)
    target = TfliteTarget(TfliteTarget.Options(litert=False))
    graph = target.integer_graph(qgraph)
    artifact = exported(target, qgraph, tmp_path)
    x = inputs_for(path, 6, seed=4)
    x_q = quantize_input(qgraph, x)
    traced = target.trace(artifact, x_q, tmp_path)
    reference = run_integer(graph, x_q, keep_intermediates=True)
    assert len(traced) >= 10
    for name, values in traced.items():
        assert np.array_equal(values, reference[name]), name
    tree = read_model(artifact / MODEL_FILE)
    bias = next(tensor for tensor in tree.subgraphs[0].tensors if tensor.name == b"op2_conv_2d:conv/bias")
    tree.buffers[bias.buffer].data = np.frombuffer((np.arange(16, dtype=np.int32) * 997).tobytes(), np.uint8)
    builder = flatbuffers.Builder(0)
    builder.Finish(tree.Pack(builder), file_identifier=b"TFL3")
    (artifact / MODEL_FILE).write_bytes(bytes(builder.Output()))
    with pytest.raises(CheckError, match=r"first diverging layer 'op2_conv_2d:conv'"):
        check_stage(target, graph, artifact, x, None, tmp_path, tmp_path / "debug", Progress.silent())
    import os
    import subprocess
    import sys

    [bundle] = (tmp_path / "debug").iterdir()
    rerun = subprocess.run(["sh", str(bundle / "run.sh")], capture_output=True, text=True, check=False,
                           env={**os.environ, "PYTHON": sys.executable})
    assert rerun.returncode != 0   # the bundle's run.sh reproduces the mismatch: cmp finds the outputs differ
    assert (bundle / "rerun.bin").read_bytes() == (bundle / "actual.bin").read_bytes()
