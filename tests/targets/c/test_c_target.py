"""The C target: generated C99 compiles warning-free and matches dabuild's integer reference bit for bit."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from test_c_kernels import image, small_cnn
from test_lowering import lower as lower_graph
from test_quantize import lower, mlp_graph

from dabuild.errors import BuildError, CheckError
from dabuild.ir import Node
from dabuild.progress import Progress
from dabuild.qir.qgraph import QGraph
from dabuild.qir.reference import run_integer, run_quantized
from dabuild.targets.c import CTarget
from dabuild.targets.c.arena import plan_arena
from dabuild.targets.check import check_stage

STRICT = ["-O2", "-Wall", "-Wextra", "-Werror", "-pedantic"]


def random_mlp(granularity: str = "per_tensor", standalone_relu: bool = False) -> QGraph:
    graph = mlp_graph([20, 24, 16, 7], ["relu", "relu", "none"], seed=11)
    if standalone_relu:  # fc2 without fused relu, followed by a relu node
        graph.nodes[1].attrs = {"activation": "none"}
        graph.nodes[1].outputs = ["pre2"]
        graph.nodes.insert(2, Node("act2", "relu", ["pre2"], ["h2"], {}))
    x = np.random.default_rng(12).normal(size=(256, 20)).astype(np.float32)
    return lower(graph, x, granularity)


def export(qgraph: QGraph, folder: Path, target: CTarget) -> Path:
    folder.mkdir()
    target.export(qgraph, folder)
    return folder


def random_int8(samples: int, features: int, seed: int = 13) -> np.ndarray:
    """Full-range int8 inputs: far outside calibration too, so saturation paths run."""
    return np.random.default_rng(seed).integers(-128, 128, (samples, features)).astype(np.int8)


@pytest.mark.parametrize("granularity,standalone_relu", [("per_tensor", False), ("per_channel", True)])
def test_c_output_equals_the_integer_reference(tmp_path: Path, granularity: str, standalone_relu: bool) -> None:
    qgraph = random_mlp(granularity, standalone_relu)
    target = CTarget(CTarget.Options(cflags=STRICT))
    artifact = export(qgraph, tmp_path / "artifact", target)
    x_q = random_int8(300, 20)
    actual = target.run(artifact, x_q, tmp_path)
    assert actual.dtype == np.int8 and actual.shape == (300, 7)
    assert np.array_equal(actual, run_integer(qgraph, x_q))
    assert len(np.unique(actual)) > 20  # not a degenerate constant output


@pytest.mark.parametrize("cores,samples", [(3, 7), (4, 2)])
def test_check_runs_the_program_on_every_core_with_the_same_bits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 cores: int, samples: int) -> None:
    """The host program runs on consecutive slices of the samples, one process per core (never more than
    samples), and its rows come back in the samples' order, bit for bit the reference's."""
    import dabuild.targets.c as c_target

    monkeypatch.setattr(c_target, "available_cores", lambda: cores)
    qgraph = random_mlp()
    target = CTarget(CTarget.Options(cflags=STRICT))
    artifact = export(qgraph, tmp_path / "artifact", target)
    x_q = random_int8(samples, 20)
    work = tmp_path / "work"
    work.mkdir()
    assert np.array_equal(target.run(artifact, x_q, work), run_integer(qgraph, x_q))
    parts = sorted(folder.name for folder in work.glob("part-*"))
    assert parts == [f"part-{index}" for index in range(min(cores, samples))]
    sizes = [(work / part / "inputs.bin").stat().st_size // 20 for part in parts]
    assert sum(sizes) == samples and max(sizes) - min(sizes) <= 1


def test_clang_builds_the_same_bits(tmp_path: Path) -> None:
    if shutil.which("clang") is None:
        pytest.skip("clang is not installed")
    qgraph = random_mlp()
    target = CTarget(CTarget.Options(compiler="clang", cflags=STRICT))
    artifact = export(qgraph, tmp_path / "artifact", target)
    x_q = random_int8(300, 20)
    assert np.array_equal(target.run(artifact, x_q, tmp_path), run_integer(qgraph, x_q))


def test_float_entry_point_matches_the_fake_quant_reference(tmp_path: Path) -> None:
    qgraph = random_mlp()
    artifact = export(qgraph, tmp_path / "artifact", CTarget())
    driver = tmp_path / "float_driver.c"
    driver.write_text(
        '#include <stdio.h>\n#include "model.h"\n'
        "int main(void) {\n  float in[MODEL_INPUT_SIZE], out[MODEL_OUTPUT_SIZE];\n"
        "  while (fread(in, sizeof(float), MODEL_INPUT_SIZE, stdin) == MODEL_INPUT_SIZE) {\n"
        "    if (model_forward_float(in, out) != 0) return 1;\n"
        "    fwrite(out, sizeof(float), MODEL_OUTPUT_SIZE, stdout);\n  }\n  return 0;\n}\n")
    program = tmp_path / "float_driver"
    sources = [str(artifact / name) for name in json.loads((artifact / "model.json").read_text())["sources"]
               if name != "main.c"]
    subprocess.run(["cc", "-std=c99", *STRICT, "-I", str(artifact), "-o", str(program), str(driver), *sources],
                   check=True)
    x = np.random.default_rng(14).normal(scale=2.0, size=(200, 20)).astype(np.float32)
    x[0, :3] = [np.nan, np.inf, -1e30]
    result = subprocess.run([str(program)], input=x.tobytes(), capture_output=True, check=True)
    got = np.frombuffer(result.stdout, dtype=np.float32).reshape(200, 7)
    assert np.array_equal(got, run_quantized(qgraph, x))


def test_generated_makefile_and_cmake_build(tmp_path: Path) -> None:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    artifact = export(random_mlp(), tmp_path / "artifact", CTarget())
    subprocess.run(["make", "-s", "CFLAGS=" + " ".join(STRICT), "model_test", "lib"], cwd=artifact, check=True,
                   capture_output=True)
    assert (artifact / "model_test").is_file() and (artifact / "libmodel.a").is_file()
    assert "add_executable(model_test main.c)" in (artifact / "CMakeLists.txt").read_text()


def test_export_is_deterministic_and_plans_a_ping_pong_arena(tmp_path: Path) -> None:
    qgraph = random_mlp()
    first = export(qgraph, tmp_path / "a", CTarget())
    second = export(qgraph, tmp_path / "b", CTarget())
    assert sorted(p.name for p in first.iterdir()) == sorted(p.name for p in second.iterdir())
    for path in first.iterdir():
        assert path.read_bytes() == (second / path.name).read_bytes(), path.name
    # 20 -> 24 -> 16 -> 7: h1 (24 bytes) and h2 (16 bytes) are alive together at fc2.
    assert json.loads((first / "model.json").read_text())["arena_bytes"] == 24 + 16
    assert "#define MODEL_ARENA_BYTES 40" in (first / "model.h").read_text()
    assert not re.search(r"\bmalloc\s*\(|#include <math.h>", "".join(p.read_text() for p in first.glob("*.[ch]")))


def test_arena_planner_reuses_memory_of_dead_tensors() -> None:
    chain = [(["x"], ["a"]), (["a"], ["b"]), (["b"], ["c"]), (["c"], ["y"])]
    plan = plan_arena(chain, {"a": 100, "b": 8, "c": 100}, external={"x", "y"})
    assert plan.placements["a"].offset == plan.placements["c"].offset == 0  # a is dead when c is born
    assert plan.peak_bytes == 108
    skip = [(["x"], ["a"]), (["a"], ["b"]), (["b"], ["c"]), (["a", "c"], ["y"])]  # a lives to the end
    plan = plan_arena(skip, {"a": 100, "b": 8, "c": 100}, external={"x", "y"})
    assert plan.peak_bytes == 208  # a, b and c are all alive while c is computed


def test_arena_planner_keeps_the_step_order_plan_where_largest_first_leaves_a_hole() -> None:
    """VWW's head in small: largest first puts d, then a, at 0, so c must go above both b and d (peak 7); placed
    in step order c sits where a was and d above it, the liveness bound (c and d alive together)."""
    chain = [(["x"], ["a"]), (["a"], ["b"]), (["b"], ["c"]), (["c"], ["d"]), (["d"], ["y"])]
    plan = plan_arena(chain, {"a": 3, "b": 2, "c": 2, "d": 4}, external={"x", "y"})
    assert plan.peak_bytes == plan.lower_bound_bytes == 6
    assert plan.placements["c"].offset == plan.placements["a"].offset == 0


def test_missing_compiler_names_it_and_the_fix(tmp_path: Path) -> None:
    target = CTarget(CTarget.Options(compiler="dabuild-no-such-cc"))
    artifact = export(random_mlp(), tmp_path / "artifact", target)
    with pytest.raises(BuildError, match=r"'dabuild-no-such-cc' was not found.*install gcc or clang.*options\.compiler"):
        target.run(artifact, random_int8(2, 20), tmp_path)
    with pytest.raises(BuildError, match="dabuild-no-such-cc"):
        target.runtime_version()


def test_runtime_version_is_the_compilers_first_line() -> None:
    version = CTarget().runtime_version()
    first_line = subprocess.run(["cc", "--version"], check=False, capture_output=True, text=True).stdout.splitlines()[0]
    assert version == {"cc": first_line}


def _corrupt_first_weight(artifact: Path, layer: str = "fc1") -> None:
    header = artifact / f"layer_{layer}.h"
    text = header.read_text()
    match = re.search(r"_weight\[[^\]]*\] = \{\n\s*(-?\d+)", text)
    assert match is not None
    value = int(match.group(1))
    header.write_text(text[:match.start(1)] + str(127 if value < 0 else -128) + text[match.end(1):])


def test_a_corrupted_artifact_fails_check_with_a_reproducible_bundle(tmp_path: Path) -> None:
    qgraph = random_mlp()
    target = CTarget(CTarget.Options(cflags=STRICT))
    artifact = export(qgraph, tmp_path / "artifact", target)
    pristine = (artifact / "layer_fc1.h").read_text()
    _corrupt_first_weight(artifact)
    x = np.random.default_rng(15).normal(size=(200, 20)).astype(np.float32)
    out_dir, bundles = tmp_path / "out", tmp_path / "debug"
    out_dir.mkdir()
    with pytest.raises(CheckError, match=r"first diverging output at sample \d+, output \d+") as failure:
        check_stage(target, qgraph, artifact, x, "exact", out_dir, bundles, Progress.silent())
    bundle = Path(re.search(r"debug bundle: (\S+)$", str(failure.value)).group(1))
    assert bundle.parent == bundles
    for name in ("inputs.npy", "expected.npy", "actual.npy", "reference_trace.npz", "versions.json", "run.sh",
                 "artifact/model.c", "artifact/layer_fc1.h"):
        assert (bundle / name).is_file(), name
    report = json.loads((out_dir / "report.json").read_text())
    assert report["ok"] is False and report["mismatches"] > 0
    assert not np.array_equal(np.load(bundle / "expected.npy"), np.load(bundle / "actual.npy"))
    trace = np.load(bundle / "reference_trace.npz")
    assert {"x", "h1", "h2", "h3", "fc1:accumulator"} <= set(trace.files)
    # run.sh rebuilds the bundled (corrupt) artifact and reports the difference ...
    assert subprocess.run(["sh", str(bundle / "run.sh")], check=False, capture_output=True).returncode != 0
    # ... and agrees once the artifact is repaired.
    (bundle / "artifact" / "layer_fc1.h").write_text(pristine)
    rerun = subprocess.run(["sh", str(bundle / "run.sh")], check=False, capture_output=True, text=True)
    assert rerun.returncode == 0 and "outputs match" in rerun.stdout


def cnn() -> QGraph:
    return lower_graph(small_cnn(), image(200, (64,), seed=8) * 2)


def test_trace_returns_every_layer_output_as_the_integer_reference_has_it(tmp_path: Path) -> None:
    qgraph = cnn()
    # the trace build compiles under -Werror too; layer by layer, every tensor exists (test_c_patch traces a patch)
    target = CTarget(CTarget.Options(cflags=STRICT, patch="off"))
    artifact = export(qgraph, tmp_path / "artifact", target)
    x_q = random_int8(40, 64)
    (tmp_path / "run").mkdir()
    # The plain build links without defining dabuild_trace: without the macro the hook calls are no code.
    assert np.array_equal(target.run(artifact, x_q, tmp_path / "run"), run_integer(qgraph, x_q))
    (tmp_path / "trace").mkdir()
    traced = target.trace(artifact, x_q, tmp_path / "trace")
    assert traced is not None
    reference = run_integer(qgraph, x_q, keep_intermediates=True)
    aliases = {"img", "f"}  # reshape and flatten: zero-copy, not traced
    outputs = {name for layer in qgraph.layers for name in layer.outputs}
    assert set(traced) == {qgraph.input} | outputs - aliases
    stored = {entry["tensor"]: entry["order"] for entry in json.loads((artifact / "model.json").read_text())["traced"]}
    assert stored["h1"] != sorted(stored["h1"])  # some tensors are stored channels last and come back reordered
    for name, values in traced.items():
        assert values.dtype == np.int8 and np.array_equal(values, reference[name]), name


def test_a_corrupted_layer_is_named_as_the_first_to_diverge(tmp_path: Path) -> None:
    qgraph = cnn()
    target = CTarget(CTarget.Options(cflags=STRICT, patch="off"))   # dw's output h2 exists whole
    artifact = export(qgraph, tmp_path / "artifact", target)
    _corrupt_first_weight(artifact, "dw")  # the depthwise conv, whose output h2 is stored channels last
    x = image(100, (64,), seed=9) * 2
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    with pytest.raises(CheckError, match=r"first diverging layer 'dw' \(tensor 'h2'\): \d+ of \d+ values") as failure:
        check_stage(target, qgraph, artifact, x, "exact", out_dir, tmp_path / "debug", Progress.silent())
    bundle = Path(re.search(r"debug bundle: (\S+)$", str(failure.value)).group(1))
    report = json.loads((bundle / "report.json").read_text())
    assert report["divergence"].startswith("first diverging layer 'dw'")
    target_trace, reference_trace = np.load(bundle / "target_trace.npz"), np.load(bundle / "reference_trace.npz")
    assert np.array_equal(target_trace["h1"], reference_trace["h1"])  # the layer before still agrees


def test_ops_without_integer_form_are_refused_after_trace_naming_target_nodes_and_op() -> None:
    from dabuild.ir import Graph, TensorSpec
    from dabuild.quant.lowering import integer_forms

    scale = np.full(4, 2.0, np.float32)
    graph = Graph([TensorSpec("x", (None, 4))], ["z"],
                  [Node("half", "div", ["x", "two"], ["y"]), Node("act", "relu", ["y"], ["r"]),
                   Node("again", "div", ["r", "two"], ["z"])], {"two": scale})
    with pytest.raises(BuildError, match=r"target 'c' cannot build this model; ops it cannot take:\n"
                                         r"  div: no exact integer form, .*; nodes 'half', 'again'$"):
        CTarget(CTarget.Options(cpu="cortex-m0")).refuse(graph, integer_forms())  # no FPU: no float islands
    CTarget(CTarget.Options()).refuse(graph, integer_forms())  # the host runs div as a float island (the c capability's float_ops)
    CTarget(CTarget.Options()).refuse(mlp_graph([4, 8, 3], ["relu", "none"]), integer_forms())  # every op lowers to layers the C kernels run
