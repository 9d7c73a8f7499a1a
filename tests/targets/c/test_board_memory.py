"""A model too big for its Cortex-M board fails the c target's export with the sizes, before any compiler or
emulator runs: the arena (plus streaming state and the heap and stack reserve) against the board's RAM, the
constants against its flash; and the tuner's `fits` reports the same instead of failing."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlperf_tiny import Builder, quantized_graph

from dabuild.errors import BuildError
from dabuild.ir import Graph
from dabuild.targets.c import CTarget, firmware
from dabuild.targets.c.codegen import render
from dabuild.targets.c.profiles import PROFILES

M0 = PROFILES["cortex-m0"]   # microbit: 16 KiB RAM, 256 KiB flash


def wide_activations() -> Graph:
    """A 1x64x64 image into 8 channels: a 32 KiB activation, a few hundred bytes of weights."""
    b = Builder((1, 64, 64), seed=9)
    x = b.batch_norm(b.conv("x", 1, 8, (3, 3), (1, 1), (1, 1, 1, 1)))
    return b.finish(b.dense(b.node("flatten", [b.node("avg_pool", [x], kernel=[64, 64])]), 8, 3))


def heavy_weights() -> Graph:
    """A 640 -> 480 dense layer: 307,200 int8 weights, more than the board's flash."""
    b = Builder((640,), seed=10)
    return b.finish(b.dense("x", 640, 480))


def test_an_arena_beyond_the_boards_ram_fails_with_the_sizes(tmp_path: Path) -> None:
    qgraph, _ = quantized_graph(wide_activations())
    arena = render(qgraph, M0).arena.peak_bytes
    assert M0.board is not None and arena > M0.board.ram_bytes
    with pytest.raises(firmware.BoardOverflow) as error:
        CTarget(CTarget.Options(cpu="cortex-m0")).export(qgraph, tmp_path)
    message = str(error.value)
    assert isinstance(error.value, BuildError) and error.value.exit_code == 1
    needed = arena + firmware.STACK_RESERVE
    assert (f"does not fit board microbit: RAM needs {needed} bytes (arena {arena} + reserve for heap and stack "
            f"{firmware.STACK_RESERVE}) but the board has {M0.board.ram_bytes}, {needed - M0.board.ram_bytes} too few"
            in message)
    assert "flash" not in message.split("; make")[0]


def test_constants_beyond_the_boards_flash_fail_with_the_sizes(tmp_path: Path) -> None:
    qgraph, _ = quantized_graph(heavy_weights())
    constants = render(qgraph, M0).weight_bytes
    assert M0.board is not None
    with pytest.raises(firmware.BoardOverflow, match=f"flash needs {constants} bytes \\(constants {constants}\\) but "
                                                     f"the board has {M0.board.flash_bytes}"):
        CTarget(CTarget.Options(cpu="cortex-m0")).export(qgraph, tmp_path)


def test_the_tuner_sees_a_model_that_does_not_fit_its_board() -> None:
    qgraph, _ = quantized_graph(wide_activations())
    reason = CTarget(CTarget.Options(cpu="cortex-m0", budget={"ram": "1M"})).fits(qgraph)
    assert reason is not None and reason.startswith("cortex-m0: ") and "RAM needs" in reason
