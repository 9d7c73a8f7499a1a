"""Float islands in the C target: float kernels on the host and on Cortex-M cores with an FPU, bit-exact
against the integer reference (its island sums add in the C kernels' order); cores without one refuse them.

The graph holds every kind of float kernel: conv (plain, depthwise, pointwise), dense, max pool, mean, add,
leaky relu and a copy, each tried as an island with the quantized layer before it handing it float.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from test_c_kernels import STRICT

from dabuild.errors import BuildError
from dabuild.ir import Graph, Node, TensorSpec
from dabuild.progress import Progress
from dabuild.qir.layers.island_order import run_ordered
from dabuild.qir.qgraph import QGraph
from dabuild.qir.reference import quantize_input, run_integer
from dabuild.quant.calibrate import calibrate
from dabuild.quant.config import NodeConfig
from dabuild.quant.defaults import default_config
from dabuild.quant.quantize import quantize
from dabuild.targets.c import CTarget
from dabuild.targets.check import check_stage

C = CTarget().capability_spec  # the c capability as the c target runs it: islands of its float kernels
DATA = dict(np.load(Path(__file__).resolve().parent.parent / "recipes" / "digits" / "data.npz"))
ISLANDS = [["conv1", "pool"], ["pointwise", "residual", "act"], ["gap", "flat", "fc1"], ["fc2"]]
QEMU = shutil.which("arm-none-eabi-gcc") is not None and shutil.which("qemu-system-arm") is not None


def island_cnn(channels: int = 6) -> Graph:
    """reshape -> conv+relu -> max_pool -> depthwise+relu6 -> pointwise -> residual add -> leaky_relu ->
    global_avg_pool -> flatten -> dense+relu -> dense."""
    rng = np.random.default_rng(8)
    constants = {"w1": rng.normal(0, 1 / 3, (channels, 1, 3, 3)), "b1": rng.normal(0, 0.1, channels),
                 "w2": rng.normal(0, 1 / 3, (channels, 1, 3, 3)), "b2": rng.normal(0, 0.1, channels),
                 "w3": rng.normal(0, 1 / np.sqrt(channels), (channels, channels, 1, 1)), "b3": rng.normal(0, 0.1, channels),
                 "w4": rng.normal(0, 0.5, (channels, 16)), "b4": rng.normal(0, 0.1, 16),
                 "w5": rng.normal(0, 0.3, (16, 10)), "b5": rng.normal(0, 0.1, 10)}
    nodes = [
        Node("image", "reshape", ["x"], ["image"], {"shape": [0, 1, 8, 8]}),
        Node("conv1", "conv", ["image", "w1", "b1"], ["c1"], {"pads": [1, 1, 1, 1], "activation": "relu"}),
        Node("pool", "max_pool", ["c1"], ["p1"], {"kernel": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
        Node("depthwise", "conv", ["p1", "w2", "b2"], ["c2"], {"pads": [1, 1, 1, 1], "groups": channels,
                                                               "activation": "relu6"}),
        Node("pointwise", "conv", ["c2", "w3", "b3"], ["c3"], {}),
        Node("residual", "add", ["c3", "p1"], ["r"], {}),
        Node("act", "leaky_relu", ["r"], ["a"], {"alpha": 0.1}),
        Node("gap", "global_avg_pool", ["a"], ["g"], {}),
        Node("flat", "flatten", ["g"], ["f"], {}),
        Node("fc1", "dense", ["f", "w4", "b4"], ["h"], {"activation": "relu"}),
        Node("fc2", "dense", ["h", "w5", "b5"], ["y"], {}),
    ]
    return Graph([TensorSpec("x", (None, 64))], ["y"], nodes,
                 {name: np.asarray(value, np.float32) for name, value in constants.items()})


def with_islands(island: list[str], graph: Graph | None = None) -> QGraph:
    """`graph` (default: island_cnn) quantized with the nodes of `island` in fp32."""
    graph = graph or island_cnn()
    config = default_config(graph, C)
    for name in island:
        config.nodes[name] = NodeConfig(weight=None, activation=None)
    stats = calibrate(graph, [{"x": DATA["x_train"][:300]}], Progress.silent())
    return quantize(graph, stats, config)


def exported(qgraph: QGraph, folder: Path, cpu: str) -> tuple[CTarget, Path]:
    target = CTarget(CTarget.Options(cpu=cpu, cflags=STRICT))
    artifact = folder / "artifact"
    artifact.mkdir(parents=True)
    target.export(qgraph, artifact)
    return target, artifact


def test_the_ordered_sums_are_the_float_ops_within_rounding() -> None:
    """island_order computes the IR ops (only the order of their float sums differs)."""
    from dabuild.ir.ops import OPS

    rng = np.random.default_rng(0)
    x, w, b = (rng.normal(size=shape).astype(np.float32) for shape in [(3, 6, 9, 7), (6, 2, 3, 3), (6,)])
    attrs = {"strides": [2, 1], "pads": [0, 1, 2, 0], "dilations": [1, 2], "groups": 3, "activation": "relu"}
    np.testing.assert_allclose(run_ordered("conv", [x, w, b], attrs)[0], OPS["conv"].run([x, w, b], attrs)[0],
                               rtol=1e-5, atol=1e-5)
    dense = [rng.normal(size=(4, 3, 20)).astype(np.float32), rng.normal(size=(20, 7)).astype(np.float32)]
    np.testing.assert_allclose(run_ordered("dense", dense, {})[0], OPS["dense"].run(dense, {})[0], rtol=1e-5, atol=1e-5)
    mean = {"axes": [1, 3], "keepdims": False}
    np.testing.assert_allclose(run_ordered("reduce_mean", [x], mean)[0], OPS["reduce_mean"].run([x], mean)[0],
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("island", ISLANDS)
def test_islands_are_exact_on_the_host(island: list[str], tmp_path: Path) -> None:
    qgraph = with_islands(island)
    kernels = {layer.name: layer.op for layer in qgraph.layers}
    assert all(kernels[name] == "float" for name in island) and qgraph.floats
    target, artifact = exported(qgraph, tmp_path, "host")
    manifest = json.loads((artifact / "model.json").read_text())
    assert {manifest["kernels"][name] for name in island} <= {"float_conv", "float_max_pool", "float_binary",
                                                               "float_unary", "float_mean", "float_dense"}
    x = DATA["x_test"][:200]
    (tmp_path / "check").mkdir()
    report = check_stage(target, qgraph, artifact, x, None, tmp_path / "check", tmp_path / "debug", Progress.silent())
    assert report["ok"] and report["tolerance"] == "exact" and report["reference"] == "integer"
    assert set(island) <= set(report["float_islands"]["layers"]) and "exact" in report["float_islands"]["float_order"]
    work = tmp_path / "work"
    work.mkdir()
    x_q = quantize_input(qgraph, x)
    np.testing.assert_array_equal(target.run(artifact, x_q, work), run_integer(qgraph, x_q))


def test_island_tensors_are_the_references_float32_bits(tmp_path: Path) -> None:
    """The depthwise conv before the pointwise island is quantized but writes float (float_weighted); the C
    trace of every float tensor equals the integer reference's float32 bit for bit, where the same conv summed
    in float64 and rounded once gives other bits: the float32 order is what makes the islands exact. (The IR's
    own float32 conv is no witness: its native kernels may sum in the islands' order on some CPUs.)"""
    from dabuild.ir.ops import OPS

    qgraph = with_islands(["pointwise", "residual", "act", "gap", "flat", "fc1"])
    layers = {layer.name: layer for layer in qgraph.layers}
    assert layers["depthwise"].op == "float_weighted" and set(qgraph.floats) == {"c2", "c3", "r", "a", "g", "f"}
    target, artifact = exported(qgraph, tmp_path, "host")
    manifest = json.loads((artifact / "model.json").read_text())
    assert manifest["kernels"]["depthwise"] == "float_conv"
    assert manifest["arena"]["peak_bytes"] >= 4 * 6 * 4 * 4  # a float32 (6, 4, 4) buffer
    work = tmp_path / "work"
    work.mkdir()
    x_q = quantize_input(qgraph, DATA["x_test"][:300])
    traced = target.trace(artifact, x_q, work)
    reference = run_integer(qgraph, x_q, keep_intermediates=True)
    assert traced is not None and set(qgraph.floats) <= set(traced)
    for name in qgraph.floats:
        assert traced[name].dtype == np.float32
        np.testing.assert_array_equal(traced[name].view(np.int32), reference[name].view(np.int32), err_msg=name)
    pointwise = layers["pointwise"]
    wide = OPS["conv"].run([reference["c2"].astype(np.float64),
                            *(qgraph.constants[n].astype(np.float64) for n in pointwise.inputs[1:])],
                           pointwise.op_attrs)[0].astype(np.float32)
    assert np.any(wide != traced["c3"]) and np.allclose(wide, traced["c3"], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.skipif(not QEMU, reason="needs gcc-arm-none-eabi, libnewlib-arm-none-eabi and qemu-system-arm")
@pytest.mark.parametrize("cpu", ["cortex-m4", "cortex-m7", "cortex-m33", "cortex-m55"])
def test_islands_are_exact_in_qemu(cpu: str, tmp_path: Path) -> None:
    """The FPU (and on the M55, Helium's float lanes where GCC vectorises) computes the reference's float32
    bits: outputs and every island tensor equal, built with -mfloat-abi=hard."""
    qgraph = with_islands(["pointwise", "residual", "act", "gap", "flat", "fc1"])
    target, artifact = exported(qgraph, tmp_path, cpu)
    assert "-mfloat-abi=hard" in target.profile.flags and "-ffp-contract=off" in target.profile.flags
    x_q = quantize_input(qgraph, DATA["x_test"][:40])
    reference = run_integer(qgraph, x_q, keep_intermediates=True)
    for name, folder in (("run", tmp_path / "run"), ("trace", tmp_path / "trace")):
        folder.mkdir()
        if name == "run":
            np.testing.assert_array_equal(target.run(artifact, x_q, folder), reference[qgraph.output])
            continue
        traced = target.trace(artifact, x_q, folder)
        assert traced is not None and set(qgraph.floats) <= set(traced)
        for tensor in qgraph.floats:
            np.testing.assert_array_equal(traced[tensor].view(np.int32), reference[tensor].view(np.int32), tensor)


def attention_block() -> Graph:
    """avg_pool over the 8x8 image, its rows as 8 tokens; q, k, v dense; softmax(q @ k^T * scale) @ v; a
    matmul by a constant; then gelu (erf), gelu (tanh), tanh, sigmoid, erf and exp in a row, and a dense head."""
    rng = np.random.default_rng(9)
    constants = {f"w{name}": rng.normal(0, 0.5, (8, 8)) for name in "qkv"} | {
        f"b{name}": rng.normal(0, 0.1, 8) for name in "qkv"} | {
        "scale": np.full(1, 8 ** -0.5), "proj": rng.normal(0, 0.5, (8, 8)), "wo": rng.normal(0, 0.3, (64, 10))}
    nodes = [
        Node("image", "reshape", ["x"], ["image"], {"shape": [0, 1, 8, 8]}),
        Node("pool", "avg_pool", ["image"], ["pooled"], {"kernel": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1]}),
        Node("tokens", "reshape", ["pooled"], ["t"], {"shape": [0, 8, 8]}),
        *(Node(name, "dense", ["t", f"w{name}", f"b{name}"], [name + "_out"], {}) for name in "qkv"),
        Node("kt", "transpose", ["k_out"], ["kt_out"], {"perm": [0, 2, 1]}),
        Node("scores", "matmul", ["q_out", "kt_out"], ["s"], {}),
        Node("scaled", "mul", ["s", "scale"], ["ss"], {}),
        Node("attend", "softmax", ["ss"], ["a"], {"axis": -1}),
        Node("mixed", "matmul", ["a", "v_out"], ["m"], {}),
        Node("project", "matmul", ["m", "proj"], ["p"], {}),
        Node("gelu", "gelu", ["p"], ["g1"], {}),
        Node("gelu_tanh", "gelu", ["g1"], ["g2"], {"approximate": "tanh"}),
        Node("tanh", "tanh", ["g2"], ["h1"], {}),
        Node("sigmoid", "sigmoid", ["h1"], ["h2"], {}),
        Node("erf", "erf", ["h2"], ["h3"], {}),
        Node("exp", "exp", ["h3"], ["h4"], {}),
        Node("flat", "flatten", ["h4"], ["f"], {}),
        Node("head", "dense", ["f", "wo"], ["y"], {}),
    ]
    return Graph([TensorSpec("x", (None, 64))], ["y"], nodes,
                 {name: np.asarray(value, np.float32) for name, value in constants.items()})


ATTENTION_ISLAND = ["pool", "tokens", "kt", "scores", "scaled", "attend", "mixed", "project", "gelu", "gelu_tanh",
                    "tanh", "sigmoid", "erf", "exp", "flat"]


def test_the_transcendentals_are_the_ir_ops_within_a_few_ulp() -> None:
    """island_order's exp, tanh, sigmoid, erf, gelu, softmax, matmul and avg_pool (the C kernels' float32
    sequences) compute the IR ops: exp within 1 ulp of float64's e**x over its whole finite range."""
    from dabuild.ir.ops import OPS
    from dabuild.qir.layers.island_order import expf32

    x = np.linspace(-86.9, 88.7, 400_001, dtype=np.float32)
    exact = np.exp(x.astype(np.float64))
    assert np.max(np.abs(expf32(x) - exact) / np.spacing(exact.astype(np.float32))) <= 1.0
    assert expf32(np.float32(89.0)) == np.inf and expf32(np.float32(-88.0)) == 0 and np.isnan(expf32(np.nan))
    v = np.random.default_rng(0).normal(0, 3, (4, 6, 5)).astype(np.float32)
    for op, attrs in (("exp", {}), ("tanh", {}), ("sigmoid", {}), ("erf", {}), ("gelu", {}),
                      ("gelu", {"approximate": "tanh"}), ("softmax", {"axis": 1})):
        want = OPS[op].run([v], OPS[op].resolve(attrs))[0]
        np.testing.assert_allclose(run_ordered(op, [v], attrs)[0], want, rtol=2e-6, atol=5e-7, err_msg=op)
    a, b = v[:, None], np.random.default_rng(1).normal(size=(3, 5, 2)).astype(np.float32)
    np.testing.assert_allclose(run_ordered("matmul", [a, b], {})[0], a @ b, rtol=1e-5, atol=1e-6)
    pool = {"kernel": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": True}
    np.testing.assert_allclose(run_ordered("avg_pool", [v[None]], pool)[0],
                               OPS["avg_pool"].run([v[None]], OPS["avg_pool"].resolve(pool))[0], rtol=1e-6)


def test_an_attention_island_is_exact_on_the_host(tmp_path: Path) -> None:
    """avg_pool, transpose, matmul of two tensors and by a constant, softmax and the transcendentals as one
    island (q, k, v quantized, handing it float): outputs and every island tensor bit-exact, check `exact`."""
    qgraph = with_islands(ATTENTION_ISLAND, attention_block())
    target, artifact = exported(qgraph, tmp_path, "host")
    kernels = json.loads((artifact / "model.json").read_text())["kernels"]
    assert {kernels[name] for name in ATTENTION_ISLAND} == {
        "float_avg_pool", "float_unary", "float_transpose", "float_matmul", "float_binary", "float_softmax"}
    assert {kernels[name] for name in "qkv"} == {"float_dense"}
    x = DATA["x_test"][:200]
    (tmp_path / "check").mkdir()
    report = check_stage(target, qgraph, artifact, x, None, tmp_path / "check", tmp_path / "debug", Progress.silent())
    assert report["ok"] and report["tolerance"] == "exact"
    work = tmp_path / "work"
    work.mkdir()
    x_q = quantize_input(qgraph, x)
    traced = target.trace(artifact, x_q, work)
    reference = run_integer(qgraph, x_q, keep_intermediates=True)
    assert traced is not None and set(qgraph.floats) <= set(traced)
    for name in qgraph.floats:
        np.testing.assert_array_equal(traced[name].view(np.int32), reference[name].view(np.int32), err_msg=name)


@pytest.mark.slow
@pytest.mark.skipif(not QEMU, reason="needs gcc-arm-none-eabi, libnewlib-arm-none-eabi and qemu-system-arm")
def test_an_attention_island_is_exact_in_qemu(tmp_path: Path) -> None:
    """On a Cortex-M4F the FPU and dabuild's own exp (no newlib libm) give the reference's float32 bits."""
    qgraph = with_islands(ATTENTION_ISLAND, attention_block())
    target, artifact = exported(qgraph, tmp_path, "cortex-m4")
    x_q = quantize_input(qgraph, DATA["x_test"][:20])
    reference = run_integer(qgraph, x_q, keep_intermediates=True)
    traced = target.trace(artifact, x_q, tmp_path)
    assert traced is not None
    for name in [*qgraph.floats, qgraph.output]:
        np.testing.assert_array_equal(traced[name], reference[name], err_msg=name)


@pytest.mark.parametrize("cpu", ["cortex-m0", "cortex-m3"])
def test_cores_without_an_fpu_refuse_islands(cpu: str, tmp_path: Path) -> None:
    qgraph = with_islands(["fc2"])
    with pytest.raises(BuildError, match=rf"node 'fc1' .*cpu '{cpu}' has no FPU"):
        exported(qgraph, tmp_path, cpu)
    assert CTarget.refuses_float_islands({"cpu": cpu}) and CTarget.refuses_float_islands({}) is None


def test_an_op_without_a_float_kernel_names_the_layer(tmp_path: Path) -> None:
    """A log_softmax island would need a log: the c capability does not offer it, and a QGraph that has one
    anyway is refused naming the layer."""
    cnn = island_cnn()
    graph = Graph(cnn.inputs, ["s"], [*cnn.nodes, Node("soft", "log_softmax", ["y"], ["s"], {})], cnn.constants)
    assert not C.runs_float("log_softmax") and C.runs_float("softmax")
    config = default_config(cnn, C)
    config.nodes["soft"] = NodeConfig(weight=None, activation=None)
    stats = calibrate(graph, [{"x": DATA["x_train"][:100]}], Progress.silent())
    with pytest.raises(BuildError, match=r"layer 'soft'.*float op 'log_softmax'"):
        exported(quantize(graph, stats, config), tmp_path, "host")


def test_tuning_never_makes_an_op_without_a_float_kernel_fp32() -> None:
    """elu has an integer form (a table) but no C float kernel: its node is offered integer choices only, the
    softmax beside it fp32 too; a recipe asking elu for fp32 is an error at its line (tests/corpus/recipes/
    float_island_op_without_kernel.yaml)."""
    from dabuild.tune.space import FP32, build_space

    cnn = island_cnn()
    graph = Graph(cnn.inputs, ["s"], [*cnn.nodes, Node("smooth", "elu", ["y"], ["e"], {}),
                                      Node("soft", "softmax", ["e"], ["s"], {})], cnn.constants)
    space = build_space(graph, C)
    assert FP32 not in space.nodes["smooth"].candidates and len(space.nodes["smooth"].candidates) > 0
    assert FP32 in space.nodes["soft"].candidates and FP32 in space.nodes["fc2"].candidates
    with pytest.raises(BuildError, match=r"op_type\.elu\.activation\.dtype: capability 'c' runs no float island"):
        build_space(graph, C, {"op_type": {"elu": {"activation": {"dtype": ["fp32"]}}}})


def test_tuning_never_makes_a_conv_with_a_fused_activation_without_a_float_kernel_fp32(tmp_path: Path) -> None:
    """A conv whose fused hard_swish has no C float kernel is offered integer choices only (an island of it would
    be refused at export, as the second half shows); the conv with a fused relu keeps its fp32 choice."""
    from dabuild.tune.space import FP32, build_space

    cnn = island_cnn()
    nodes = [Node(n.name, n.op, n.inputs, n.outputs, {**n.attrs, "activation": "hard_swish", "activation_attrs": {}})
             if n.name == "depthwise" else n for n in cnn.nodes]
    graph = Graph(cnn.inputs, cnn.outputs, nodes, cnn.constants)
    assert C.runs_float("conv") and not C.runs_float("conv", "hard_swish") and C.runs_float("conv", "relu")
    space = build_space(graph, C)
    assert FP32 not in space.nodes["depthwise"].candidates and len(space.nodes["depthwise"].candidates) > 0
    assert FP32 in space.nodes["conv1"].candidates
    with pytest.raises(BuildError, match=r"op_name\.depthwise\.activation\.dtype: .*runs no float island of op "
                                         r"'conv' with its fused hard_swish"):
        build_space(graph, C, {"op_name": {"depthwise": {"activation": {"dtype": ["fp32"]}}}})
    with pytest.raises(BuildError, match=r"layer 'depthwise'.*its fused hard_swish has no float kernel"):
        exported(with_islands(["depthwise"], graph), tmp_path, "host")


@pytest.mark.parametrize("cpu", ["host", "cortex-m3"])
def test_tuning_offers_islands_only_where_the_core_runs_them(digits: Path, cpu: str) -> None:
    """The c capability runs float islands, but not on a core without an FPU: the tune stage of a recipe
    building for one reads the capability without them, so tuning never picks a config the target refuses."""
    from dabuild.pipeline.plan import plan
    from dabuild.recipe import load_recipe

    recipe_file = digits / "recipe.yaml"
    recipe_file.write_text(recipe_file.read_text().replace("options: {cflags: [-O2]}",
                                                           f"options: {{cflags: [-O2], cpu: {cpu}}}"))
    recipe = load_recipe(recipe_file)
    [tune] = [stage for stage in plan(recipe, ["mcu"]) if stage.kind == "tune"]
    assert tune.config["capability"]["fp32_fallback"] is (cpu == "host")


def test_a_float_mean_over_the_batch_is_refused(tmp_path: Path) -> None:
    graph = island_cnn()
    nodes = [Node("whole", "reduce_mean", ["x"], ["m"], {"axes": [0, 1], "keepdims": True}),
             Node("scaled", "mul", ["x", "m"], ["xm"], {}), *graph.nodes]
    nodes[2] = Node("image", "reshape", ["xm"], ["image"], {"shape": [0, 1, 8, 8]})
    graph = Graph(graph.inputs, graph.outputs, nodes, graph.constants)
    config = default_config(graph, C)
    config.nodes["whole"] = NodeConfig(weight=None, activation=None)
    stats = calibrate(graph, [{"x": DATA["x_train"][:100]}], Progress.silent())
    with pytest.raises(BuildError, match=r"layer 'whole'.*reduces the batch axis"):
        exported(quantize(graph, stats, config), tmp_path, "host")


def test_an_op_without_an_integer_form_builds_as_an_island_end_to_end(tmp_path: Path) -> None:
    """div has no integer lowering: the c target takes it as a float island on the host (tuning keeps it
    fp32, the dense before it hands it float) and the check is exact; on a core without an FPU it is refused
    before any stage runs."""
    from dabuild.cli import main

    rng = np.random.default_rng(6)
    np.savez(tmp_path / "weights.npz", w1=rng.normal(0, 0.4, (64, 12)), d=rng.uniform(0.5, 2.0, 12),
             w2=rng.normal(0, 0.4, (12, 10)))
    (tmp_path / "model.py").write_text(
        "import numpy as np\n\ndef build(weights):\n"
        "    def forward(x):\n"
        "        h = np.maximum(x @ weights['w1'], 0)\n"
        "        return (h / weights['d']) @ weights['w2']\n"
        "    return forward\n")
    np.savez(tmp_path / "data.npz", x_train=DATA["x_train"][:200], x_test=DATA["x_test"][:100],
             y_test=DATA["y_test"][:100])
    recipe = """name: divide
model: {{framework: numpy, source: model.py:build, weights: weights.npz, inputs: {{x: [null, 64]}}}}
data:
  calibration: {{source: data.npz, x: x_train}}
  evaluation: {{source: data.npz, x: x_test, y: y_test}}
  metric: accuracy
tuning: {{strategy: basic, accuracy: {{criterion: relative, tolerable_loss: 0.5}}}}
targets:
  - {{name: mcu, kind: c, options: {{cpu: {cpu}}}}}
"""
    (tmp_path / "recipe.yaml").write_text(recipe.format(cpu="host"))
    assert main(["build", str(tmp_path), "--build-dir", str(tmp_path / "build"), "-q"]) == 0
    summary = json.loads((tmp_path / "build" / "divide" / "build.json").read_text())
    check = summary["checks"]["mcu"]
    assert check["ok"] and check["tolerance"] == "exact" and check["float_islands"]["layers"]
    (tmp_path / "recipe.yaml").write_text(recipe.format(cpu="cortex-m3"))
    assert main(["build", str(tmp_path), "--build-dir", str(tmp_path / "build3"), "-q"]) == 1
