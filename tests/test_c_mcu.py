"""The C target's Cortex-M profiles: every conv/dense kernel variant (portable, DSP, Helium) bit-exact in qemu,
the firmware figures, budgets, traces and the errors for missing tools.

Each case is one of test_c_kernels' op/spec cases, exported for a profile, cross-compiled with -Werror and
run in qemu-system-arm on a few random int8 inputs, all in one boot.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from test_c_kernels import CASES, STRICT, lowered, small_cnn, weights
from test_lowering import graph_of, image, lower, with_weights
from test_quantize import C_CAPABILITY

from dabuild.errors import BuildError
from dabuild.quant.config import default_config
from dabuild.quant.reference import run_integer
from dabuild.targets.c import CTarget, parse_bytes
from dabuild.targets.c.codegen import stored_bytes
from dabuild.targets.c.kernels.linear import interleave
from dabuild.targets.c.profiles import PROFILES

pytestmark = pytest.mark.skipif(shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None,
                                reason="needs gcc-arm-none-eabi, libnewlib-arm-none-eabi and qemu-system-arm")

SAMPLES = 24
# One profile per kernel variant: portable C99 (M0), the DSP extension (M4) and Helium (M55).
VARIANTS = ("cortex-m0", "cortex-m4", "cortex-m55")
WEIGHTED = ["dense per tensor", "dense per channel relu6", "conv 3x3 pad 1", "conv stride 2 asymmetric pads per channel",
            "conv dilation 2 clip", "conv groups 2", "conv 1x1 no pad", "conv1d", "depthwise",
            "depthwise multiplier 2 stride"]


def run_in_qemu(qgraph, folder: Path, cpu: str, **options) -> tuple[np.ndarray, np.ndarray, dict, CTarget]:
    target = CTarget(CTarget.Options(cpu=cpu, cflags=STRICT, **options))
    artifact, work = folder / "artifact", folder / "work"
    artifact.mkdir(parents=True)
    work.mkdir()
    target.export(qgraph, artifact)
    x_q = np.random.default_rng(31).integers(-128, 128, (SAMPLES, *qgraph.tensors[qgraph.input].shape)).astype(np.int8)
    actual = target.run(artifact, x_q, work)
    expected = np.asarray(run_integer(qgraph, x_q)).reshape(SAMPLES, -1)
    return actual, expected, json.loads((artifact / "model.json").read_text()), target


@pytest.mark.slow
@pytest.mark.parametrize("cpu", VARIANTS)
@pytest.mark.parametrize("case", WEIGHTED)
def test_kernel_variant_equals_the_integer_reference_in_qemu(case: str, cpu: str, tmp_path: Path) -> None:
    actual, expected, manifest, _ = run_in_qemu(lowered(case), tmp_path, cpu)
    assert np.array_equal(actual, expected), f"{np.sum(actual != expected)} of {expected.size} outputs differ"
    assert manifest["cpu"] == cpu and manifest["firmware"]["flash_bytes"] > 0
    if case.startswith("conv ") or case == "conv1d":
        assert set(manifest["kernels"].values()) >= {"conv_mcu"}


@pytest.mark.parametrize("cpu", VARIANTS)
def test_small_cnn_is_exact_in_qemu_and_measured(cpu: str, tmp_path: Path) -> None:
    qgraph = lower(small_cnn(), image(200, (64,), seed=8) * 2)
    actual, expected, manifest, target = run_in_qemu(qgraph, tmp_path, cpu)
    assert np.array_equal(actual, expected)
    measured = target.measurements(tmp_path / "artifact", np.zeros((1, 64), np.int8), tmp_path / "work")["firmware"]
    assert measured["board"] == PROFILES[cpu].board.machine
    assert measured["rodata_bytes"] >= 0.95 * manifest["weight_bytes"] > 0  # the constants (a few fold into code)
    assert measured["bss_bytes"] >= manifest["arena_bytes"] and measured["stack_bytes"] > 0
    assert 10_000 < measured["instructions_per_inference"] < 2_000_000


def test_trace_under_qemu_gives_every_layer(tmp_path: Path) -> None:
    qgraph = lower(small_cnn(), image(200, (64,), seed=8) * 2)
    _, _, _, target = run_in_qemu(qgraph, tmp_path, "cortex-m4")
    x_q = np.random.default_rng(3).integers(-128, 128, (3, 64)).astype(np.int8)
    (tmp_path / "trace_work").mkdir()
    traced = target.trace(tmp_path / "artifact", x_q, tmp_path / "trace_work")
    reference = run_integer(qgraph, x_q, keep_intermediates=True)
    assert traced is not None and {"h1", "h2", "r", "logits"} <= set(traced)
    for tensor, values in traced.items():
        assert np.array_equal(values, np.asarray(reference[tensor]).reshape(values.shape)), tensor


def test_budget_overflow_fails_naming_it(tmp_path: Path) -> None:
    qgraph = lower(small_cnn(), image(200, (64,), seed=8) * 2)
    target = CTarget(CTarget.Options(cpu="cortex-m4", budget={"flash": "1KiB", "ram": "64KiB"}))
    (tmp_path / "artifact").mkdir()
    target.export(qgraph, tmp_path / "artifact")
    with pytest.raises(BuildError, match=r"does not fit its budget: flash \d+ bytes exceeds the budget of 1024 by \d+"):
        target.run(tmp_path / "artifact", np.zeros((1, 64), np.int8), tmp_path)


def test_int8_weights_take_half_the_host_layout() -> None:
    qgraph = lowered("conv 1x1 no pad")   # 24 x 16 weights: int16 on the host, int8 on a Cortex-M
    assert stored_bytes(qgraph, "host") - stored_bytes(qgraph, "cortex-m4") == 24 * 16


def test_interleave_is_its_own_inverse_and_pairs_for_sxtb16() -> None:
    rows = np.arange(8).reshape(1, 8)
    assert interleave(rows).tolist() == [[0, 2, 1, 3, 4, 6, 5, 7]]
    assert np.array_equal(interleave(interleave(rows)), rows)


def test_sizes_and_options_are_validated() -> None:
    assert parse_bytes("64KiB") == 65536 and parse_bytes("1.5 MiB") == 1572864 and parse_bytes(300) == 300
    with pytest.raises(ValueError, match="is not a size"):
        parse_bytes("64 furlongs")
    with pytest.raises(ValueError, match="budget is measured on a Cortex-M image"):
        CTarget.Options(budget={"flash": 1000})
    with pytest.raises(ValueError, match="runner: command needs options.command"):
        CTarget.Options(cpu="cortex-m4", runner="command")


def test_missing_cross_compiler_names_the_packages(tmp_path: Path) -> None:
    target = CTarget(CTarget.Options(cpu="cortex-m4", compiler="dabuild-no-such-arm-gcc"))
    with pytest.raises(BuildError, match="gcc-arm-none-eabi libnewlib-arm-none-eabi"):
        target.export(lowered("relu"), tmp_path)


def test_runner_command_runs_the_users_program(tmp_path: Path) -> None:
    """A user command in place of qemu (here qemu itself, as a board would be flashed and read back)."""
    command = ["sh", "-c", "qemu-system-arm -M mps2-an386 -nographic -monitor none -serial none "
               "-semihosting-config enable=on,target=native -kernel {image}"]
    actual, expected, _, _ = run_in_qemu(lowered("conv 3x3 pad 1"), tmp_path, "cortex-m4", runner="command",
                                         command=command)
    assert np.array_equal(actual, expected)


@pytest.mark.parametrize("features", [37, 20])
def test_int4_dense_weights_are_packed_two_per_byte_and_exact(features: int, tmp_path: Path) -> None:
    nodes, _, constants, _, _ = CASES["dense per channel relu6"]
    graph = graph_of(nodes, (features,), {"w": weights(features, 5), "b": weights(5)})
    config = with_weights(default_config(graph, C_CAPABILITY), dtype="int4", granularity="per_channel")
    qgraph = lower(graph, image(128, (features,), seed=3) * 2, config)
    actual, expected, manifest, _ = run_in_qemu(qgraph, tmp_path, "cortex-m4")
    assert np.array_equal(actual, expected)
    rows = 5 * -(-features // 2)   # packed bytes: half of the int8 weights, rounded up per row
    assert stored_bytes(qgraph, "host") - stored_bytes(qgraph, "cortex-m4") == 5 * features - rows
