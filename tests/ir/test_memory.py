"""Memory: arrays mapped from stage outputs, thread pools across fork, the budget's message, calibration's heap.

(Batch-size independence under a cut budget: tests/quant/test_calibration.py; the compiled integer layers
that forked trial workers run: tests/ir/test_integer_kernels.py; -j N scoring as serial: tests/tune/test_tuning.py.)
"""

from __future__ import annotations

import os
import platform
import resource
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from dabuild.errors import BuildError
from dabuild.ir import Graph, Node
from dabuild.ir.graph import TensorSpec
from dabuild.ir.kernels import native
from dabuild.ir.kernels.native import layer_threads
from dabuild.ir.memory import BUDGET, arrays_reused_in_heap, release_free_memory, samples_that_fit
from dabuild.ir.npz import read_npz, write_npz


def test_mapped_members_read_as_the_eager_ones_and_cannot_be_written(tmp_path: Path) -> None:
    arrays = {"f": np.arange(12.0).reshape(3, 4), "empty": np.zeros((0, 5), np.int8),
              "fortran": np.asfortranarray(np.arange(6).reshape(2, 3)), "bytes": np.int8([1, -2, 3])}
    write_npz(tmp_path / "a.npz", arrays)
    write_npz(tmp_path / "b.npz", arrays)
    assert (tmp_path / "a.npz").read_bytes() == (tmp_path / "b.npz").read_bytes()  # byte-stable, streamed or not
    mapped, eager = read_npz(tmp_path / "a.npz", mapped=True), read_npz(tmp_path / "a.npz")
    for name, array in arrays.items():
        assert mapped[name].dtype == array.dtype and np.array_equal(mapped[name], array)
        assert np.array_equal(eager[name], array)
    assert not mapped["f"].flags.writeable
    with pytest.raises(ValueError):
        mapped["f"][0, 0] = 1.0
    write_npz(tmp_path / "c.npz", arrays, compress=True)  # compressed members are read eagerly
    assert all(np.array_equal(read_npz(tmp_path / "c.npz", mapped=True)[n], a) for n, a in arrays.items())


def test_a_loaded_graph_maps_its_weights(tmp_path: Path) -> None:
    weight = np.random.default_rng(0).standard_normal((16, 4)).astype(np.float32)
    graph = Graph([TensorSpec("x", (None, 16))], ["y"], [Node("fc", "dense", ["x", "w"], ["y"], {})], {"w": weight})
    graph.save(tmp_path)
    loaded = Graph.load(tmp_path)
    assert np.array_equal(loaded.constants["w"], weight) and not loaded.constants["w"].flags.writeable


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_forked_child_starts_new_threads_for_its_layers() -> None:
    """The parent's conv thread pool does not survive fork; the child must not wait for its threads."""
    from dabuild.qir.layers.linear import QConv
    from dabuild.qir.qgraph import QGraph, QTensor, QuantParams

    conv = native.native_conv()
    if conv is None or conv.integer is None:
        pytest.skip("no C compiler: the native integer kernels cannot be built")
    rng = np.random.default_rng(1)
    layer = QConv(name="c", inputs=["x"], outputs=["y"], weight=rng.integers(-9, 9, (64, 32, 3, 3)).astype(np.int8),
                  bias=np.zeros(64, np.int32), multiplier=np.array([2**30], np.int32), shift=np.array([40], np.int32),
                  weight_scale=np.ones(1), output_min=-128, output_max=127, strides=[1, 1], pads=[1] * 4,
                  dilations=[1, 1], groups=1)
    params = QuantParams(0.1, 0, "int8")
    graph = QGraph("x", "y", {"x": QTensor((32, 40, 40), params), "y": QTensor((64, 40, 40), params)}, [layer])
    x = rng.integers(-128, 128, (2, 32, 40, 40)).astype(np.int8)
    with layer_threads(2):
        expected = layer.run([x], graph, None)[0]  # starts the pool in the parent
        child = os.fork()
        if child == 0:  # pragma: no cover - the child's result is its exit status
            status = 1
            try:
                status = 0 if np.array_equal(layer.run([x], graph, None)[0], expected) else 1
            finally:
                os._exit(status)
    deadline = time.monotonic() + 120
    while (done := os.waitpid(child, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        pytest.fail("the forked child hung waiting for the parent's conv threads")
    assert os.waitstatus_to_exitcode(done[1]) == 0


def test_a_model_past_the_budget_names_the_stage_and_what_it_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    graph = Graph([TensorSpec("x", (None, 3, 8, 8))], ["y"], [Node("r", "relu", ["x"], ["y"], {})], {})
    monkeypatch.setenv(BUDGET, "10M")
    assert samples_that_fit(graph, "calibrate", 64) == 64
    with pytest.raises(BuildError, match=r"calibrate: the model needs about 0\.01 GB .*histograms 0\.01 GB.*"
                                         r"memory budget of 0\.01 GB"):
        samples_that_fit(graph, "calibrate", 64, held=10 << 20, holds="histograms")
    # a stage's share of the budget (-j N, see tune_stage): fewer samples at once, and its own message
    assert samples_that_fit(graph, "tune", 64, budget=(10 << 20) // 64) < samples_that_fit(graph, "tune", 64)
    with pytest.raises(BuildError, match=r"tune: .*more than its share \(0\.00 GB\) of the memory budget of "
                                         r"0\.01 GB; raise DABUILD_MEMORY, lower -j"):
        samples_that_fit(graph, "tune", 64, budget=100)
    release_free_memory()  # harmless wherever it runs


def test_within_arrays_reused_in_heap_a_freed_array_s_memory_serves_the_next() -> None:
    """A 64 MiB array (past glibc's largest mmap threshold) is page-faulted in afresh each time it is made
    again, except within `arrays_reused_in_heap`, where the second and later ones reuse the first's memory;
    after it, arrays are mapped again."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        pytest.skip("mallopt is glibc's")

    def faults() -> int:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        array = np.ones(1 << 24, np.float32)
        del array
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    outside = faults()
    with arrays_reused_in_heap():
        faults()  # the heap grows to hold it once
        assert faults() == 0 and faults() == 0
    assert outside > 0 and faults() > 0
