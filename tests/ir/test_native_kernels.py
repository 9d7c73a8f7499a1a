"""The interpreter's compiled conv (dabuild.ir.kernels) against its numpy path, and the compiled library's cache."""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from support import VECTOR_WIDTHS

from dabuild import notices
from dabuild.ir import Graph, Node, TensorSpec
from dabuild.ir.interpreter import Interpreter
from dabuild.ir.kernels import compiling, native
from dabuild.ir.kernels.compiling import Sources
from dabuild.ir.ops import OPS
from dabuild.ir.ops.linear import UNCHANGED, Epilogue, Geometry, _native_conv
from dabuild.ir.ops.pool import _native_pool

pytestmark = pytest.mark.skipif(shutil.which(native.COMPILER) is None, reason="no C compiler")


WIDTHS = VECTOR_WIDTHS  # every vector path this machine can run: 64, 32 and 16 bytes on AVX-512

def conv_both_ways(monkeypatch: pytest.MonkeyPatch, arrays: list[np.ndarray], attrs: dict,
                   then: tuple[str, dict] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(native, numpy) results of one conv kernel call; `then` fuses a residual add (the last array) and activation."""
    kernel = OPS["conv"].prepare_residual(attrs, then)
    monkeypatch.delenv(native.SWITCH, raising=False)
    assert native.native_conv() is not None
    compiled = kernel([a.copy() for a in arrays], None)[0]
    monkeypatch.setenv(native.SWITCH, "0")
    reference = kernel([a.copy() for a in arrays], None)[0]
    monkeypatch.delenv(native.SWITCH)
    return compiled, reference


def assert_close(compiled: np.ndarray, reference: np.ndarray) -> None:
    """Equal up to float summation order: relative 1e-5 of the output's scale."""
    assert compiled.shape == reference.shape and compiled.dtype == reference.dtype == np.float32
    scale = float(np.max(np.abs(reference))) or 1.0
    np.testing.assert_allclose(compiled, reference, rtol=1e-5, atol=1e-5 * scale)


CASES = [  # batch, channels, out_channels, spatial size, kernel, strides, pads, dilations, groups
    (64, 3, 16, (32, 32), (3, 3), [1, 1], [1, 1, 1, 1], [1, 1], 1),  # the bench net's stem
    (4, 16, 16, (32, 32), (3, 3), [1, 1], [1, 1, 1, 1], [1, 1], 1),
    (4, 16, 32, (32, 32), (3, 3), [2, 2], [1, 1, 1, 1], [1, 1], 1),
    (4, 16, 32, (32, 32), (1, 1), [2, 2], [0, 0, 0, 0], [1, 1], 1),
    (4, 32, 64, (16, 16), (3, 3), [2, 2], [1, 1, 1, 1], [1, 1], 1),
    (4, 64, 64, (8, 8), (3, 3), [1, 1], [1, 1, 1, 1], [1, 1], 1),
    (3, 5, 10, (7, 9), (3, 2), [1, 2], [2, 0, 1, 1], [2, 1], 1),  # O not a whole vector, asymmetric everything
    (2, 7, 40, (11, 13), (5, 5), [3, 1], [0, 2, 2, 4], [1, 2], 1),  # 2.5 vectors, pads wider than the stride
    (1, 1, 1, (1, 1), (1, 1), [1, 1], [0, 0, 0, 0], [1, 1], 1),
    (2, 4, 20, (5, 19), (3, 3), [1, 1], [3, 3, 3, 3], [1, 1], 1),  # pads larger than the kernel's reach
    (5, 6, 48, (21,), (4,), [2], [1, 3], [3], 1),  # 1-D
    (4, 32, 32, (16, 16), (3, 3), [1, 1], [1, 1, 1, 1], [1, 1], 32),  # depthwise
    (3, 20, 20, (9, 11), (3, 5), [2, 1], [1, 2, 0, 3], [1, 2], 20),  # depthwise, a partial last vector
    (2, 6, 6, (15,), (3,), [1], [1, 1], [2], 6),  # depthwise 1-D
    (1, 116, 116, (12, 28), (3, 3), [1, 1], [1, 1, 1, 1], [1, 1], 116),  # depthwise: rows of 8-pixel blocks
    (2, 24, 24, (9, 37), (3, 3), [2, 2], [1, 1, 1, 1], [1, 1], 24),  # depthwise, strided blocks, partial vector
    (1, 40, 40, (6, 30), (5, 5), [1, 1], [2, 1, 2, 5], [2, 2], 40),  # depthwise, dilated, uneven pads
    (1, 300, 70, (9, 7), (3, 3), [1, 1], [1, 1, 1, 1], [1, 1], 1),  # K in blocks of a tap's channel chunks
    (2, 40, 150, (6, 5), (1, 1), [2, 2], [0, 0, 0, 0], [1, 1], 1),  # channel blocks of 4, 4 and 2 vectors
    (1, 3, 24, (30, 30), (7, 7), [2, 2], [3, 3, 3, 3], [1, 1], 1),  # a stem: K in blocks of kernel rows
    (2, 8, 16, (6, 6), (3, 3), [1, 1], [1, 1, 1, 1], [1, 1], 8),  # two outputs per group
    (2, 8, 16, (6, 6), (3, 3), [1, 1], [1, 1, 1, 1], [1, 1], 2),  # grouped
    (1, 24, 112, (14, 14), (1, 1), [1, 1], [0, 0, 0, 0], [1, 1], 4),  # ShuffleNet v1's: 28 outputs per group
    (2, 136, 136, (7, 9), (1, 1), [1, 1], [0, 0, 0, 0], [1, 1], 4),  # 34 per group: a partial vector in each
    (2, 12, 30, (9, 8), (3, 3), [2, 1], [1, 0, 2, 1], [1, 2], 3),  # grouped, strided, dilated, uneven pads
    (1, 640, 64, (5, 5), (3, 3), [1, 1], [1, 1, 1, 1], [1, 1], 2),  # grouped, K in blocks of channel chunks
    (3, 6, 9, (13,), (3,), [2], [1, 1], [1], 3),  # grouped 1-D
    (3, 1100, 20, (5, 7), (1, 1), [1, 1], [0, 0, 0, 0], [1, 1], 1),  # pointwise: flat runs, K in channel chunks
    (2, 10, 40, (3, 3), (1, 1), [1, 1], [0, 0, 0, 0], [1, 1], 1),  # pointwise: an image smaller than a block
]


@pytest.mark.parametrize("batch, channels, out_channels, size, kernel, strides, pads, dilations, groups", CASES)
@pytest.mark.parametrize("bias, activation", [(True, "relu"), (False, "none"), (True, "sigmoid"), (True, "relu6")])
def test_conv_matches_numpy(monkeypatch: pytest.MonkeyPatch, vector_path: int, batch: int, channels: int, out_channels: int,
                            size: tuple[int, ...], kernel: tuple[int, ...], strides: list[int], pads: list[int],
                            dilations: list[int], groups: int, bias: bool, activation: str) -> None:
    rng = np.random.default_rng(channels * 100 + out_channels)
    arrays = [rng.standard_normal((batch, channels, *size)).astype(np.float32),
              (rng.standard_normal((out_channels, channels // groups, *kernel))
               / np.sqrt(channels // groups * np.prod(kernel))).astype(np.float32)]  # outputs of order 1
    if bias:
        arrays.append(rng.standard_normal(out_channels).astype(np.float32))
    attrs = {"strides": strides, "pads": pads, "dilations": dilations, "groups": groups, "activation": activation}
    assert_close(*conv_both_ways(monkeypatch, arrays, attrs))


@pytest.mark.parametrize("then", [("relu", {}), ("none", {}), ("leaky_relu", {"alpha": 0.1})])
def test_fused_residual_matches_numpy(monkeypatch: pytest.MonkeyPatch, vector_path: int, then: tuple[str, dict]) -> None:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((6, 24, 12, 12)).astype(np.float32)
    weight = rng.standard_normal((24, 24, 3, 3)).astype(np.float32)
    bias = rng.standard_normal(24).astype(np.float32)
    residual = rng.standard_normal((6, 24, 12, 12)).astype(np.float32) * 10
    attrs = {"pads": [1, 1, 1, 1]}
    assert_close(*conv_both_ways(monkeypatch, [x, weight, bias, residual], attrs, then))


def test_clip_bounds_match_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(5)
    arrays = [rng.standard_normal((2, 8, 6, 6)).astype(np.float32), rng.standard_normal((20, 8, 3, 3)).astype(np.float32)]
    attrs = {"pads": [1] * 4, "activation": "clip", "activation_attrs": {"min": -0.5, "max": None}}
    assert_close(*conv_both_ways(monkeypatch, arrays, attrs))


def test_layer_threads_give_the_same_bits(monkeypatch: pytest.MonkeyPatch, vector_path: int) -> None:
    """Rows split among threads: every output computed as on one thread, bit for bit."""
    monkeypatch.delenv(native.SWITCH, raising=False)
    rng = np.random.default_rng(9)
    x = rng.standard_normal((1, 130, 17, 15)).astype(np.float32)
    weight = rng.standard_normal((90, 130, 3, 3)).astype(np.float32)
    kernel = OPS["conv"].prepare({"pads": [1] * 4, "activation": "relu"})
    one = kernel([x, weight], None)[0]
    with native.layer_threads(2):
        two = kernel([x, weight], None)[0]
    np.testing.assert_array_equal(one, two)


@pytest.mark.parametrize("case", ["conv", "grouped", "depthwise"])
def test_few_rows_split_by_channel_give_the_same_bits(monkeypatch: pytest.MonkeyPatch, vector_path: int,
                                                       case: str) -> None:
    """A layer with fewer output rows than its threads' chunks splits each row's output channels into parts too
    (conv.c's `units`); every output is still computed as on one thread, bit for bit, and the parts cover every
    channel once (a partial last vector and a narrower last weight block included)."""
    monkeypatch.delenv(native.SWITCH, raising=False)
    rng = np.random.default_rng(11)
    shapes = {"conv": ((1, 150, 3, 9), (203, 150, 3, 3), 1), "grouped": ((1, 96, 2, 11), (150, 32, 3, 3), 3),
              "depthwise": ((2, 1000, 2, 30), (1000, 1, 3, 3), 1000)}
    x_shape, w_shape, groups = shapes[case]
    x = rng.standard_normal(x_shape).astype(np.float32)
    weight = rng.standard_normal(w_shape).astype(np.float32)
    bias = rng.standard_normal(w_shape[0]).astype(np.float32)
    kernel = OPS["conv"].prepare({"pads": [1] * 4, "groups": groups, "activation": "relu"})
    one = kernel([x, weight, bias], None)[0]
    for threads in (3, 8, 16):
        with native.layer_threads(threads):
            np.testing.assert_array_equal(kernel([x, weight, bias], None)[0], one)


@pytest.mark.parametrize("channels", [24, 1100])
def test_pointwise_blocks_depend_on_the_image_alone(monkeypatch: pytest.MonkeyPatch, vector_path: int,
                                                    channels: int) -> None:
    """A pointwise conv's register blocks run across an image's rows (conv.c's `flat_rows_of_kblock`) but never
    across images nor by the thread split: each image alone, the batch on one thread and on several give the
    same bits (with 1100 channels, K-blocks too, whose partial sums a block past a thread's rows keeps)."""
    monkeypatch.delenv(native.SWITCH, raising=False)
    rng = np.random.default_rng(13)
    x = rng.standard_normal((5, channels, 7, 7)).astype(np.float32)
    weight = rng.standard_normal((120, channels, 1, 1)).astype(np.float32)
    kernel = OPS["conv"].prepare({"activation": "relu"})
    one = kernel([x, weight], None)[0]
    np.testing.assert_array_equal(np.concatenate([kernel([x[i:i + 1], weight], None)[0] for i in range(5)]), one)
    for threads in (2, 3, 8):
        with native.layer_threads(threads):
            np.testing.assert_array_equal(kernel([x, weight], None)[0], one)


def test_channel_parts_only_where_rows_are_too_few() -> None:
    """Rows alone when they give each thread its chunks; else enough channel parts for that, at most one per
    weight block."""
    plan = native.ConvPlan.__new__(native.ConvPlan)
    plan.shape, plan.channel_steps = (1, 7, 7, 2048), 32
    assert [plan.parts(threads) for threads in (1, 2, 16)] == [1, 2, 10]
    plan.shape = (1, 112, 112, 64)
    assert plan.parts(16) == 1
    plan.shape, plan.channel_steps = (1, 1, 1, 10), 1
    assert plan.parts(16) == 1


def test_layer_threads_give_the_same_bits_while_another_process_hogs_a_core(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a busy machine the worker wakes late, on the caller's core (and gives way) or not at all, and the caller
    takes the rows it leaves: whoever computes them, a small net at batch 1 on 2 threads gives 1 thread's bits,
    run after run (threads.c's sleep, give-way and quiet paths all run here; none of them may hang)."""
    monkeypatch.delenv(native.SWITCH, raising=False)
    graph = mobile_block()
    feeds = {"x": np.random.default_rng(4).standard_normal((1, 32, 24, 24)).astype(np.float32)}
    one = Interpreter(graph, threads=1).run(feeds)["y"]
    two = Interpreter(graph, threads=2)
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        for _ in range(60):
            np.testing.assert_array_equal(two.run(feeds)["y"], one)
    finally:
        hog.kill()
        hog.wait()


def mobile_block() -> Graph:
    """A MobileNetV2 block at a size the native kernels split among threads: 1x1 expansion, 3x3 depthwise,
    1x1 projection, residual add."""
    rng = np.random.default_rng(6)
    constants = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in
                 {"w1": (192, 32, 1, 1), "w2": (192, 1, 3, 3), "w3": (32, 192, 1, 1)}.items()}
    nodes = [Node("expand", "conv", ["x", "w1"], ["e"], {"activation": "relu"}),
             Node("depthwise", "conv", ["e", "w2"], ["d"], {"pads": [1] * 4, "groups": 192, "activation": "relu"}),
             Node("project", "conv", ["d", "w3"], ["p"], {}),
             Node("sum", "add", ["p", "x"], ["y"], {})]
    return Graph([TensorSpec("x", (None, 32, 24, 24))], ["y"], nodes, constants)


def test_relu_keeps_nan_as_numpy_does(monkeypatch: pytest.MonkeyPatch) -> None:
    x = np.ones((1, 2, 4, 4), np.float32)
    x[0, 0, 1, 1] = np.nan
    weight = np.ones((3, 2, 1, 1), np.float32)
    compiled, reference = conv_both_ways(monkeypatch, [x, weight], {"activation": "relu"})
    np.testing.assert_array_equal(np.isnan(compiled), np.isnan(reference))
    assert np.isnan(compiled).sum() == 3


def residual_net() -> Graph:
    """conv+relu, conv, add of the block's input, relu: a residual block the interpreter fuses into one step."""
    rng = np.random.default_rng(3)
    constants = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in
                 {"w1": (16, 16, 3, 3), "b1": (16,), "w2": (16, 16, 3, 3), "b2": (16,)}.items()}
    nodes = [Node("c1", "conv", ["x", "w1", "b1"], ["h"], {"pads": [1] * 4, "activation": "relu"}),
             Node("c2", "conv", ["h", "w2", "b2"], ["g"], {"pads": [1] * 4}),
             Node("sum", "add", ["g", "x"], ["s"], {}),
             Node("out", "relu", ["s"], ["y"], {})]
    return Graph([TensorSpec("x", (None, 16, 10, 10))], ["y"], nodes, constants)


@pytest.mark.parametrize("threads", [1, 2])
def test_interpreter_runs_native_convs_like_numpy(monkeypatch: pytest.MonkeyPatch, threads: int) -> None:
    graph = residual_net()
    feeds = {"x": np.random.default_rng(4).standard_normal((8, 16, 10, 10)).astype(np.float32)}
    monkeypatch.delenv(native.SWITCH, raising=False)
    compiled = Interpreter(graph, threads).run(feeds)["y"]
    traced = Interpreter(graph).run(feeds, keep_intermediates=True)["y"]  # every node alone
    monkeypatch.setenv(native.SWITCH, "0")
    reference = Interpreter(graph, threads).run(feeds)["y"]
    assert_close(compiled, reference)
    assert_close(traced, reference)


def test_backend_names_the_compiler_and_path_or_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(native.SWITCH, raising=False)
    conv = native.native_conv()
    assert native.native_backend() == f"native kernels ({conv.path}): {conv.compiler}"
    assert conv.compiler and conv.vector_bytes == WIDTHS[0]
    monkeypatch.setenv(native.SWITCH, "0")
    assert native.native_conv() is None and native.native_backend() == "numpy"


def test_the_path_follows_the_compilers_target_macros() -> None:
    """vectors.h's choice for -march=native is the CPU's: 64-byte vectors with AVX-512, 32 with AVX2, else 16."""
    flags = Path("/proc/cpuinfo").read_text().split() if Path("/proc/cpuinfo").exists() else []
    expected = 64 if "avx512f" in flags else 32 if "avx" in flags else 16
    assert WIDTHS[0] == expected and [width for width in native.WIDTHS if width <= expected] == WIDTHS


def tiny_sources(text: str = "int answer(void) { return 42; }\n", version_flag: str = "-O1") -> Sources:
    return Sources({"answer.c": text}, {}, (version_flag,), "test", 16)


def test_library_is_compiled_once_into_the_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(compiling.KERNEL_CACHE, str(tmp_path))
    compiler = shutil.which(native.COMPILER)
    library, scratch = compiling.build(compiler, "test compiler 1.0", tiny_sources())
    assert "compiling native kernels (test" in capsys.readouterr().err  # a progress line, even without -v
    assert library.parent == tmp_path and library.suffix == ".so" and scratch is None
    assert library.name.startswith("test-")  # the file names the vector path
    assert [p.name for p in library.parent.iterdir()] == [library.name]  # no temporary left behind
    built = library.stat().st_ino
    assert compiling.build(compiler, "test compiler 1.0", tiny_sources())[0] == library
    assert library.stat().st_ino == built  # loaded from the cache, not compiled again
    assert capsys.readouterr().err == ""
    assert compiling.build(compiler, "test compiler 2.0", tiny_sources())[0] != library  # another compiler


def test_damaged_library_is_deleted_warned_about_and_compiled_again(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path) -> None:
    """A truncated library would crash the loader (bus error): it must fail its proof before it is loaded."""
    monkeypatch.setenv(compiling.KERNEL_CACHE, str(tmp_path))
    compiler = shutil.which(native.COMPILER)
    library, _ = compiling.build(compiler, "v", tiny_sources())
    good = library.read_bytes()
    library.chmod(0o644)
    library.write_bytes(good[: len(good) // 2])
    with notices.collect() as warned:
        rebuilt, _ = compiling.build(compiler, "v", tiny_sources())
    assert rebuilt.read_bytes() == good and rebuilt.name == library.name
    assert len(warned) == 1 and "damaged" in warned[0] and library.name in warned[0]
    assert [p.name for p in tmp_path.iterdir()] == [library.name]


def test_read_only_kernel_cache_compiles_for_the_run_and_leaves_nothing(monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path: Path) -> None:
    cache, temporary = tmp_path / "kernels", tmp_path / "tmp"
    cache.mkdir()
    temporary.mkdir()
    monkeypatch.setenv(compiling.KERNEL_CACHE, str(cache))
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    monkeypatch.setattr(compiling, "compile_library", _failing_in(cache, compiling.compile_library))
    with notices.collect() as warned:
        conv = native._load.__wrapped__()
    assert conv is not None  # still the native kernels: results do not silently change backend
    assert len(warned) == 1 and "cannot be written" in warned[0] and str(cache) in warned[0]
    assert list(cache.iterdir()) == [] and list(temporary.iterdir()) == []


def _failing_in(folder: Path, compile_):
    """compiling.compile_library, but a disk full inside `folder`: the OSError the write boundary would raise
    there (injected, as a real full disk needs a mount; tests/pipeline/test_faults.py drills a real one where it can)."""
    def compile_elsewhere(compiler: str, sources: Sources, target: Path) -> Path:
        if folder in target.parents:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(target))
        return compile_(compiler, sources, target)

    return compile_elsewhere


def test_the_interpreter_waits_for_the_compile_a_build_started_in_the_background(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A build starts the kernel compile in a thread (pipeline/build.py); the first `native_conv` while it runs
    waits for it instead of compiling again: one compile, one library in the empty kernel cache, one progress
    line, and the thread ends with nothing left to do."""
    monkeypatch.setenv(compiling.KERNEL_CACHE, str(tmp_path))
    compiled: list[str] = []

    def counted(compiler: str, version: str, sources: Sources) -> tuple[Path, Path | None]:
        compiled.append(sources.path)
        return compiling.build(compiler, version, sources)

    monkeypatch.setattr(native, "build", counted)
    native._load.cache_clear()
    try:
        native.compile_in_background()
        conv = native.native_conv()
        for thread in [t for t in threading.enumerate() if t.name == "dabuild-native-kernels"]:
            thread.join(60)
            assert not thread.is_alive()
        assert conv is not None and native.native_conv() is conv
        assert compiled == [conv.path] and len(list(tmp_path.glob("*.so"))) == 1
        assert capsys.readouterr().err.count("dabuild: compiling native kernels") == 1
    finally:
        native._load.cache_clear()  # later tests load the user's kernel cache again


def test_dabuild_kernels_compiles_ahead_so_a_build_finds_them(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """`dabuild kernels` (an install or CI step) compiles into an empty kernel cache and names the backend; a later
    process finds the library there and compiles nothing. Without a compiler it exits 1 naming numpy."""
    from dabuild.cli import main

    monkeypatch.setenv(compiling.KERNEL_CACHE, str(tmp_path))
    native._load.cache_clear()
    try:
        assert main(["kernels"]) == 0
        first = capsys.readouterr()
        assert "dabuild: compiling native kernels" in first.err and len(list(tmp_path.glob("*.so"))) == 1
        assert first.out.startswith("native kernels (") and f"(kernel cache {tmp_path})" in first.out
        native._load.cache_clear()  # a new process
        assert main(["kernels"]) == 0
        again = capsys.readouterr()
        assert again.out == first.out and "compiling" not in again.err
        native._load.cache_clear()
        monkeypatch.setattr(native, "COMPILER", "no-such-c-compiler")
        assert main(["kernels"]) == 1
        missing = capsys.readouterr()
        assert missing.out.startswith("numpy") and "no-such-c-compiler" in missing.err
    finally:
        native._load.cache_clear()


def test_no_compiler_falls_back_to_numpy_with_a_warning_naming_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "COMPILER", "no-such-c-compiler")
    with notices.collect() as warned:
        assert native._load.__wrapped__() is None
    assert len(warned) == 1 and "no-such-c-compiler" in warned[0] and "numpy" in warned[0]


def test_compile_errors_name_the_first_error_line_and_leave_nothing(monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: Path) -> None:
    cache, temporary = tmp_path / "kernels", tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setenv(compiling.KERNEL_CACHE, str(cache))
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    with pytest.raises(compiling.CompileError, match=r"failed on answer.c: answer.c:1:\d+: error: "):
        compiling.build(shutil.which(native.COMPILER), "test", tiny_sources("this is not C\n"))
    assert list(cache.iterdir()) == [] and list(temporary.iterdir()) == []


def test_a_path_that_does_not_compile_falls_back_to_the_next_narrower(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:
    """The widest path's source broken (as a compiler without its vector support would be): the next narrower path
    runs, with one warning naming it and the compiler's first error line; never numpy in silence."""
    if len(WIDTHS) < 2:
        pytest.skip("this machine's compiler builds one vector path only")
    monkeypatch.setenv(compiling.KERNEL_CACHE, str(tmp_path))
    real = native.vector_paths

    def widest_broken(compiler: str, forced: int | None = None) -> Iterator[Sources]:
        paths = list(real(compiler, forced))
        broken = dataclasses.replace(paths[0], units={**paths[0].units, "vector_path.c": "this is not C\n"})
        yield from [broken, *paths[1:]]

    monkeypatch.setattr(native, "vector_paths", widest_broken)
    with notices.collect() as warned:
        conv = native._load.__wrapped__()
    assert conv is not None and conv.vector_bytes == WIDTHS[1]
    assert len(warned) == 1 and f"run the {conv.path} path" in warned[0]
    assert "vector_path.c:1:" in warned[0] and "error" in warned[0]


@pytest.mark.parametrize("groups, out_channels", [(1, 8), (8, 8), (8, 16), (2, 8)])
@pytest.mark.parametrize("dtype, native_runs", [(np.float32, True), (np.float16, False)])
def test_which_convs_run_natively(monkeypatch: pytest.MonkeyPatch, groups: int, out_channels: int, dtype: type,
                                  native_runs: bool) -> None:
    """Every float32 conv of one or two spatial axes runs natively, grouped or not; a float16 one does not."""
    monkeypatch.delenv(native.SWITCH, raising=False)
    x = np.ones((2, 8, 5, 5), dtype)
    weight = np.ones((out_channels, 8 // groups, 3, 3), dtype)
    geometry = Geometry([3, 3], [1, 1], [1, 1, 1, 1], [1, 1])
    y = _native_conv(x, weight, groups, geometry, [5, 5], Epilogue(None, None, UNCHANGED))
    assert (y is not None) == native_runs
    if native_runs:
        assert y.shape == (2, out_channels, 5, 5) and y[0, 0, 2, 2] == 9 * 8 // groups


@pytest.mark.parametrize("case", [CASES[2], CASES[6], CASES[12], CASES[14], CASES[15], CASES[20], CASES[24]])
def test_float64_conv_of_integers_is_exact(monkeypatch: pytest.MonkeyPatch, vector_path: int, case: tuple) -> None:
    """The integer reference's sums: integer-valued float64 operands give exactly numpy's result."""
    batch, channels, out_channels, size, kernel, strides, pads, dilations, groups = case
    rng = np.random.default_rng(4)
    arrays = [rng.integers(-255, 256, (batch, channels, *size)).astype(np.float64),
              rng.integers(-127, 128, (out_channels, channels // groups, *kernel)).astype(np.float64)]
    attrs = {"strides": strides, "pads": pads, "dilations": dilations, "groups": groups}
    compiled, reference = conv_both_ways(monkeypatch, arrays, attrs)
    assert compiled.dtype == np.float64
    np.testing.assert_array_equal(compiled, reference)


def test_layer_threads_work_in_a_forked_child(monkeypatch: pytest.MonkeyPatch) -> None:
    """threads.c's workers do not survive a fork: a child (a tuning worker) starts its own and gets the same bits."""
    monkeypatch.delenv(native.SWITCH, raising=False)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 64, 24, 24)).astype(np.float32)
    weight = rng.standard_normal((64, 64, 3, 3)).astype(np.float32)
    kernel = OPS["conv"].prepare({"pads": [1] * 4})
    with native.layer_threads(2):
        parent = kernel([x, weight], None)[0]
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through its exit status
        with native.layer_threads(2):
            same = np.array_equal(kernel([x, weight], None)[0], parent)
        os._exit(0 if same else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0


POOLS = [
    ("max_pool", {"kernel": [3, 3], "strides": [2, 2]}),
    ("max_pool", {"kernel": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("max_pool", {"kernel": [3, 3], "strides": [2, 2], "ceil_mode": True}),  # SqueezeNet's: the overhang never wins
    ("max_pool", {"kernel": [2, 3], "strides": [1, 2], "pads": [1, 0, 0, 2], "dilations": [2, 1]}),
    ("avg_pool", {"kernel": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),  # ShuffleNet v1's shortcut
    ("avg_pool", {"kernel": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": True}),
    ("avg_pool", {"kernel": [2, 3], "strides": [1, 2], "pads": [1, 0, 0, 2], "ceil_mode": True}),
    ("avg_pool", {"kernel": [2, 2], "strides": [2, 2]}),
]


@pytest.mark.parametrize("op, attrs", POOLS)
def test_pools_of_a_conv_output_match_numpy_bit_for_bit(monkeypatch: pytest.MonkeyPatch, vector_path: int, op: str,
                                                        attrs: dict) -> None:
    """pool.c on a channels-last tensor: numpy's maxima (NaN winning, the later of two equal zeros kept) and
    averages (the taps summed in numpy's order, padding adding +0, divided by numpy's counts)."""
    rng = np.random.default_rng(8)
    memory = rng.standard_normal((2, 9, 11, 21)).astype(np.float32)  # (N, H, W, C): 21 channels, a partial vector
    memory[0, 2, 3, 4] = np.nan
    memory[1, :, :, 5] = np.where(rng.random((9, 11)) < 0.5, -0.0, 0.0)  # zeros of both signs
    x = memory.transpose(0, 3, 1, 2)  # (N, C, H, W) over channels-last memory, as a conv leaves it
    monkeypatch.delenv(native.SWITCH, raising=False)
    resolved = OPS[op].resolve(attrs)
    assert _native_pool(x, *OPS[op].geometry(resolved), resolved["ceil_mode"]) is not None  # pool.c takes it
    compiled = OPS[op].run([x], attrs)[0]
    assert channels_last_memory(compiled)
    monkeypatch.setenv(native.SWITCH, "0")
    reference = OPS[op].run([x], attrs)[0]
    assert compiled.shape == reference.shape
    np.testing.assert_array_equal(compiled, reference)
    assert np.array_equal(np.signbit(compiled), np.signbit(reference))


@pytest.mark.parametrize("op, attrs", [POOLS[1], POOLS[4]])
def test_large_pools_split_among_layer_threads_give_the_same_bits(monkeypatch: pytest.MonkeyPatch, op: str,
                                                                  attrs: dict) -> None:
    """A pool large enough to share its rows among layer threads gives one thread's bits."""
    monkeypatch.delenv(native.SWITCH, raising=False)
    x = np.random.default_rng(9).standard_normal((2, 80, 90, 64)).astype(np.float32).transpose(0, 3, 1, 2)
    one = OPS[op].run([x], attrs)[0]
    with native.layer_threads(4):
        np.testing.assert_array_equal(OPS[op].run([x], attrs)[0], one)


def channels_last_memory(y: np.ndarray) -> bool:
    return y.transpose(0, 2, 3, 1).flags.c_contiguous


def test_a_shared_kernel_cache_loads_only_libraries_the_team_key_signed(monkeypatch: pytest.MonkeyPatch,
                                                                        tmp_path: Path) -> None:
    cache = tmp_path / "kernels"
    cache.mkdir()
    cache.chmod(0o777)  # world-writable: anyone could put a library there
    monkeypatch.setenv(compiling.KERNEL_CACHE, str(cache))
    monkeypatch.delenv("DABUILD_CACHE_KEY", raising=False)
    compiler = shutil.which(native.COMPILER) or ""
    with notices.collect() as warned:
        library, scratch = compiling.build(compiler, "v", tiny_sources())
    assert scratch is not None and library.is_relative_to(scratch) and list(cache.iterdir()) == []
    assert len(warned) == 1 and "no team key" in warned[0]
    shutil.rmtree(scratch)
    monkeypatch.setenv("DABUILD_CACHE_KEY", "a-team-key-of-32-characters-xyz!")
    library, scratch = compiling.build(compiler, "v", tiny_sources())
    assert scratch is None and library.parent == cache and compiling.signature_of(library).is_file()
    # someone swaps in their own library, named with its own hash, and drops ours
    swapped = b"not the library dabuild compiled"
    impostor = cache / f"{library.name.split('.')[0]}.{hashlib.sha256(swapped).hexdigest()}.so"
    impostor.write_bytes(swapped)
    good = library.read_bytes()
    library.unlink()
    compiling.signature_of(library).unlink()
    with notices.collect() as warned:
        loaded, _ = compiling.build(compiler, "v", tiny_sources())
    assert loaded != impostor and loaded.read_bytes() == good  # compiled again; the impostor is never loaded
    assert any("not signed by the team key" in w and impostor.name in w for w in warned), warned
