"""island_conv.c (a float island's conv and dense, compiled) against island_order's numpy loops, bit for bit.

The numpy loops define the order the C target's float kernels add in; the compiled kernel must give the
same float32 bits on every geometry: pads on each side, strides, dilations, groups (depthwise included),
tails of pixels and of the 64-channel blocks, infinities, and a split among threads.
"""

from __future__ import annotations

import numpy as np
import pytest

from dabuild.ir.kernels import native
from dabuild.ir.kernels.native import layer_threads
from dabuild.qir.layers.island_order import run_ordered

RNG = np.random.default_rng(5)


@pytest.fixture(autouse=True)
def compiled(monkeypatch: pytest.MonkeyPatch, vector_path: int) -> None:
    """Every test on each vector path of the native kernels this machine can run."""
    monkeypatch.delenv(native.SWITCH, raising=False)
    if native.native_conv() is None:
        pytest.skip("no C compiler: the native kernels cannot be built")


def both(monkeypatch: pytest.MonkeyPatch, op: str, inputs: list[np.ndarray], attrs: dict,
         threads: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """The op by the compiled kernel and by the numpy loops."""
    with layer_threads(threads):
        compiled = run_ordered(op, inputs, attrs)[0]
    with monkeypatch.context() as numpy_only:
        numpy_only.setenv(native.SWITCH, "0")
        reference = run_ordered(op, inputs, attrs)[0]
    return compiled, reference


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(
        np.ascontiguousarray(a).view(np.uint32), np.ascontiguousarray(b).view(np.uint32))


def values(*shape: int) -> np.ndarray:
    """float32 values over many magnitudes, so that rounding (and the order of the sums) matters."""
    return (RNG.standard_normal(shape) * 2.0 ** RNG.integers(-12, 12, shape)).astype(np.float32)


CONVS = [  # channels, out channels, kernel, strides, pads (top, left, bottom, right), dilations, groups, size
    (3, 64, (7, 7), [2, 2], [3, 3, 3, 3], [1, 1], 1, (23, 23)),
    (17, 70, (3, 3), [1, 1], [1, 1, 1, 1], [1, 1], 1, (9, 11)),
    (8, 130, (1, 1), [1, 1], [0, 0, 0, 0], [1, 1], 1, (5, 6)),
    (5, 3, (3, 2), [2, 1], [0, 2, 1, 0], [2, 1], 1, (10, 7)),
    (6, 4, (3, 3), [1, 2], [1, 1, 1, 1], [1, 1], 2, (7, 9)),
    (16, 16, (3, 3), [1, 1], [1, 1, 1, 1], [1, 1], 16, (6, 13)),
    (8, 24, (3, 3), [2, 2], [1, 0, 1, 2], [1, 2], 8, (9, 9)),
]


@pytest.mark.parametrize("case", CONVS, ids=[f"c{c[0]}-o{c[1]}-k{c[2][0]}x{c[2][1]}-g{c[6]}" for c in CONVS])
@pytest.mark.parametrize("threads", [1, 2])
def test_conv_matches_the_numpy_order(monkeypatch: pytest.MonkeyPatch, case: tuple, threads: int) -> None:
    channels, out_channels, kernel, strides, pads, dilations, groups, size = case
    x = values(2, channels, *size)
    weight = values(out_channels, channels // groups, *kernel)
    bias = values(out_channels)
    attrs = {"strides": strides, "pads": pads, "dilations": dilations, "groups": groups, "activation": "relu"}
    compiled, reference = both(monkeypatch, "conv", [x, weight, bias], attrs, threads)
    assert same_bits(compiled, reference)


def test_conv_infinities_and_zeros(monkeypatch: pytest.MonkeyPatch) -> None:
    """inf * 0 is NaN and inf - inf too: both paths make the same NaNs, and signed zeros stay as numpy's."""
    x = values(1, 4, 6, 6)
    x[0, 0, 2, 3], x[0, 1, 0, 0], x[0, 2, 5, 5] = np.inf, -np.inf, -0.0
    weight = values(5, 4, 3, 3)
    weight[1, 0] = 0.0
    weight[2, 3, 1, 1] = -0.0
    attrs = {"strides": [1, 1], "pads": [1, 1, 1, 1], "dilations": [1, 1], "groups": 1, "activation": "none"}
    compiled, reference = both(monkeypatch, "conv", [x, weight], attrs)
    assert np.isnan(reference).any()
    assert same_bits(compiled, reference)


@pytest.mark.parametrize("shape", [(3, 37), (2, 4, 19)])
def test_dense_matches_the_numpy_order(monkeypatch: pytest.MonkeyPatch, shape: tuple[int, ...]) -> None:
    x = values(*shape)
    weight = values(shape[-1], 70)
    attrs = {"activation": "none"}
    compiled, reference = both(monkeypatch, "dense", [x, weight, values(70)], attrs)
    assert same_bits(compiled, reference)
