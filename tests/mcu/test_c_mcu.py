"""The C target's Cortex-M profiles: every conv/dense kernel variant (portable, DSP, Helium) bit-exact in qemu,
the firmware figures, budgets, traces and the errors for missing tools.

Each case is one of test_c_kernels' op/spec cases, exported for a profile, cross-compiled with -Werror and
run in qemu-system-arm on a few random int8 inputs, all in one boot.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from support import REPO
from test_c_kernels import CASES, STRICT, lowered, requantize_cases, small_cnn, weights
from test_lowering import graph_of, image, lower, with_weights
from test_quantize import C_CAPABILITY

from dabuild.cli import main
from dabuild.errors import BuildError
from dabuild.qir.fixed_point import requantize
from dabuild.qir.reference import run_integer
from dabuild.quant.defaults import default_config
from dabuild.targets.c import CTarget, firmware
from dabuild.targets.c.codegen import COMMON_HEADER, stored_bytes
from dabuild.targets.c.kernels.linear import channel_paired, channel_paired_wide, interleave, never_ties
from dabuild.targets.c.profiles import PROFILES

pytestmark = pytest.mark.skipif(shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None,
                                reason="needs gcc-arm-none-eabi, libnewlib-arm-none-eabi and qemu-system-arm")

SAMPLES = 24
# One profile per kernel variant: portable C99 (M0), the DSP extension (M4) and Helium (M55).
VARIANTS = ("cortex-m0", "cortex-m4", "cortex-m55")
WEIGHTED = ["dense per tensor", "dense per channel relu6", "conv 3x3 pad 1", "conv 3x3 pad 1 wide rows",
            "conv stride 2 asymmetric pads per channel",
            "conv dilation 2 clip", "conv groups 2", "conv 1x1 no pad", "conv 1x1 8 channels",
            "conv rgb stride 2 whole tiles", "conv1d", "depthwise",
            "depthwise 6 channels asymmetric pads", "depthwise 12 channels dilated columns stride 2",
            "depthwise multiplier 2 stride", "depthwise dilated stride past the band",
            "depthwise 8 channels wide rows stride 2 down", "depthwise 8 channels even rows",
            "depthwise 4 channels rows of 4k + 1 one-sided pads", "depthwise 8 channels rows of 3"]
# every case whose kernels have a portable, a DSP and a Helium path
ISA_PATHS = [*WEIGHTED, "add of feature maps then relu"]
# a case whose 24 samples (or whose map with the firmware's buffers) pass the M0 board's 16 KiB of RAM runs on the
# cores that hold it: its point is the DSP and Helium loops' wide rows, and the portable loop has smaller cases
TOO_BIG_FOR_M0 = ("depthwise 8 channels wide rows stride 2 down",)

# conv cases whose window rows (kernel width x channels bytes) are no whole number of 16-byte Helium vectors
ROWS_NOT_VECTORS = ("conv 3x3 pad 1", "conv stride 2 asymmetric pads per channel", "conv1d", "conv 1x1 8 channels",
                    "conv rgb stride 2 whole tiles")


def run_in_qemu(qgraph, folder: Path, cpu: str, cflags: list[str] = STRICT,
                **options) -> tuple[np.ndarray, np.ndarray, dict, CTarget]:
    target = CTarget(CTarget.Options(cpu=cpu, cflags=cflags, **options))
    artifact, work = folder / "artifact", folder / "work"
    artifact.mkdir(parents=True)
    work.mkdir()
    target.export(qgraph, artifact)
    x_q = np.random.default_rng(31).integers(-128, 128, (SAMPLES, *qgraph.tensors[qgraph.input].shape)).astype(np.int8)
    actual = target.run(artifact, x_q, work)
    expected = np.asarray(run_integer(qgraph, x_q))  # run keeps the reference's shape, whatever its rank
    return actual, expected, json.loads((artifact / "model.json").read_text()), target


@pytest.mark.slow
@pytest.mark.parametrize("case, cpu", [(case, cpu) for case in ISA_PATHS for cpu in VARIANTS
                                       if not (cpu == "cortex-m0" and case in TOO_BIG_FOR_M0)])
def test_kernel_variant_equals_the_integer_reference_in_qemu(case: str, cpu: str, tmp_path: Path) -> None:
    qgraph = lowered(case)
    actual, expected, manifest, _ = run_in_qemu(qgraph, tmp_path, cpu)
    assert np.array_equal(actual, expected), f"{np.sum(actual != expected)} of {expected.size} outputs differ"
    assert manifest["cpu"] == cpu and manifest["firmware"]["flash_bytes"] > 0
    if case.startswith("conv ") or case == "conv1d":
        # im2col only where a window row is not contiguous or not a whole number of the core's words or vectors,
        # and on a DSP core where the channels are no multiple of 4 (the im2col widens each window once)
        channels = qgraph.tensors[qgraph.input].shape[0]
        im2col = ("groups" in case or "dilation" in case or (cpu == "cortex-m55" and case in ROWS_NOT_VECTORS)
                  or (cpu == "cortex-m4" and channels % 4 != 0))
        assert manifest["kernels"]["c"] == ("conv_mcu" if im2col else "conv_rows")


@pytest.mark.parametrize("cpu", ["cortex-m4", "cortex-m55"])
@pytest.mark.parametrize("rounding", ["tflm", "tflm-single"])
def test_depthwise_dsp_loop_is_exact_in_the_tflm_roundings(rounding: str, cpu: str, tmp_path: Path) -> None:
    """The SXTB16/SMLABB depthwise loop (12 channels: three words per tap) feeds TFLM's requantization the
    same sums as the reference computing with that rounding: on the M4 over weights widened at export, on the
    M55 (whose vector loop rounds as dabuild only) over int8 weights widened in the loop."""
    target = CTarget(CTarget.Options(cpu=cpu, cflags=STRICT, rounding=rounding))
    qgraph = target.integer_graph(lowered("depthwise 12 channels dilated columns stride 2"))
    (tmp_path / "artifact").mkdir()
    (tmp_path / "work").mkdir()
    target.export(qgraph, tmp_path / "artifact")
    assert "__smlabb" in (tmp_path / "artifact" / "layer_c.h").read_text()
    x_q = np.random.default_rng(5).integers(-128, 128, (SAMPLES, *qgraph.tensors[qgraph.input].shape)).astype(np.int8)
    actual = target.run(tmp_path / "artifact", x_q, tmp_path / "work")
    assert np.array_equal(actual, np.asarray(run_integer(qgraph, x_q)))


@pytest.mark.parametrize("rounding", ["dabuild", "tflm"])
@pytest.mark.parametrize("flags", [[], ["-U__ARM_FEATURE_DSP"]], ids=["dsp", "no-dsp"])
@pytest.mark.parametrize("case", ["depthwise", "depthwise 8 channels wide rows stride 2 down",
                                  "depthwise 8 channels even rows", "depthwise 4 channels rows of 4k + 1 one-sided pads",
                                  "depthwise 8 channels rows of 3"])
def test_planar_depthwise_loop_is_exact(case: str, flags: list[str], rounding: str, tmp_path: Path) -> None:
    """The M4's planar depthwise loop (depthwise_planar_dsp.j2: rows widened to int16 planes, kernel rows' taps
    paired for SMLAD), on a row unrolled with an odd last output (7 wide), on rows past the unrolled width in
    chunks of output rows (51 wide, stride 2 down 19 rows), on even rows (10 wide: widened four pixels a step,
    then two, with no odd last one), on rows of 9 padded at the top and right only (four a step, then the odd
    one) and on rows of 3 (the narrowest it takes: a pair and an odd one); its portable twin without the DSP
    extension; and both feeding TFLM's requantization the same sums as the reference computing with that rounding."""
    qgraph = CTarget(CTarget.Options(cpu="cortex-m4", rounding=rounding)).integer_graph(lowered(case))
    actual, expected, _, _ = run_in_qemu(qgraph, tmp_path, "cortex-m4", cflags=[*STRICT, *flags], rounding=rounding)
    assert "__smlatb" in (tmp_path / "artifact" / "layer_c.h").read_text()
    assert np.array_equal(actual, expected), f"{np.sum(actual != expected)} of {expected.size} outputs differ"


@pytest.mark.parametrize("rounding", ["dabuild", "tflm"])
@pytest.mark.parametrize("flags", [[], ["-U__ARM_FEATURE_DSP"]], ids=["dsp", "no-dsp"])
@pytest.mark.parametrize("case", ["depthwise 12 channels dilated columns stride 2",
                                  "depthwise 6 channels asymmetric pads"])
def test_channels_last_depthwise_sums_start_at_the_bias(case: str, flags: list[str], rounding: str,
                                                        tmp_path: Path) -> None:
    """The M4's channels-last depthwise loop (the stride-2 and few-output-column layers) starts its four sums at
    the bias where they fit int32 and the shift is 32 or more, so no output adds it: exact on the SXTB16/SMLABB
    loop and its portable twin, in both roundings, on a stride-2 layer padded at every border (9 wide, taps 2
    apart: an odd width) and on 6 channels (a block of four and a scalar tail that still adds its bias), with
    asymmetric pads (top and right none)."""
    qgraph = CTarget(CTarget.Options(cpu="cortex-m4", rounding=rounding)).integer_graph(lowered(case))
    actual, expected, _, _ = run_in_qemu(qgraph, tmp_path, "cortex-m4", cflags=[*STRICT, *flags], rounding=rounding)
    assert "int32_t s0 = l_c_bias[c], s1 = l_c_bias[c + 1]" in (tmp_path / "artifact" / "layer_c.h").read_text()
    assert np.array_equal(actual, expected), f"{np.sum(actual != expected)} of {expected.size} outputs differ"


@pytest.mark.parametrize("rounding", ["dabuild", "tflm"])
@pytest.mark.parametrize("flags", [[], ["-U__ARM_FEATURE_DSP"]], ids=["dsp", "no-dsp"])
@pytest.mark.parametrize("case, marker", [("conv 1x1 8 channels", "#pragma GCC unroll 8"),
                                          ("conv rgb stride 2 whole tiles", "rows of whole tiles"),
                                          ("conv 1x1 no pad", "DABUILD_WORD_ALIGNED"),
                                          ("conv 3x3 pad 1 wide rows", "DABUILD_WORD_ALIGNED"),
                                          ("conv 1x1 int8 pairs", "__sxtb16(pair)")])
def test_few_channel_conv_loops_are_exact(case: str, marker: str, flags: list[str], rounding: str,
                                          tmp_path: Path) -> None:
    """The M4 loops of convs of few channels: conv_rows_dsp.j2 with its channel pairs' loop unrolled (a 1x1 conv
    of 8 input channels: 8 pairs of outputs, 25 pixels, so blocks of 3 and a last one of 1), the im2col conv
    on rows of whole tiles (no pixel guard, one output pointer), conv_rows_dsp.j2 on int16 weights (`wide_weights`:
    a 1x1 conv's pixels, blocks of 3 and a last one of 1, and a 3x3 conv's ring of padded rows, 2 blocks of 3) and
    on int8 channel-paired words (weights over 32 KB); each on the DSP loop and its portable twin, in both
    roundings."""
    qgraph = CTarget(CTarget.Options(cpu="cortex-m4", rounding=rounding)).integer_graph(lowered(case))
    actual, expected, _, _ = run_in_qemu(qgraph, tmp_path, "cortex-m4", cflags=[*STRICT, *flags], rounding=rounding)
    assert marker in (tmp_path / "artifact" / "layer_c.h").read_text()
    assert np.array_equal(actual, expected), f"{np.sum(actual != expected)} of {expected.size} outputs differ"


@pytest.mark.slow
@pytest.mark.parametrize("case", ["depthwise 6 channels asymmetric pads", "depthwise 12 channels dilated columns stride 2",
                                  "dense per channel relu6", "add of feature maps then relu", "conv groups 2",
                                  "conv stride 2 asymmetric pads per channel"])
def test_a_dsp_artifact_built_without_the_dsp_extension_is_exact(case: str, tmp_path: Path) -> None:
    """An M4 artifact's weights are laid out for its SMLAD loops (the depthwise weights widened and paired, the
    im2col conv's columns the raw input with its zero point in the bias); a compiler that does not define
    __ARM_FEATURE_DSP builds the portable loops, which read the same layout."""
    actual, expected, _, _ = run_in_qemu(lowered(case), tmp_path, "cortex-m4", cflags=[*STRICT, "-U__ARM_FEATURE_DSP"])
    assert np.array_equal(actual, expected), f"{np.sum(actual != expected)} of {expected.size} outputs differ"


def run_requantize_loop(cpu: str, arrays: dict[str, np.ndarray], loop: str, tmp_path: Path) -> np.ndarray:
    """The int32 `result` of `loop` (C over the int32 `arrays`, COUNT values each) in qemu on `cpu`, with the
    helpers of an artifact exported for that core in scope."""
    count = len(next(iter(arrays.values())))
    artifact = tmp_path / "artifact"
    CTarget(CTarget.Options(cpu=cpu)).export(lowered("relu"), artifact)
    declared = "\n".join(f"static const int32_t {name}[{count}] = {{{', '.join(map(str, values))}}};"
                         for name, values in arrays.items())
    (artifact / "main.c").write_text(f"""#include <stdio.h>
#include "{COMMON_HEADER}"
#define COUNT {count}
{declared}
int main(int argc, char **argv)
{{
    static int32_t result[COUNT];
    FILE *file = fopen("outputs.bin", "wb");
    (void)argc;
    (void)argv;
{loop}
    return file == NULL || fwrite(result, sizeof result, 1, file) != 1 || fclose(file) != 0;
}}
""")
    image = firmware.build_image(PROFILES[cpu], STRICT, artifact, tmp_path / "image")
    firmware.run_image(PROFILES[cpu], image.elf, tmp_path, timeout=60)
    return np.fromfile(tmp_path / "outputs.bin", np.int32)


def test_helium_requantize_rounds_every_tie_as_the_reference(tmp_path: Path) -> None:
    """dabuild_requantize32_mve (VMULH of |acc|, a rounding shift, the sign put back), four lanes at a time on
    the M55 in qemu, against the reference on requantize_cases' extremes, random values and exact ties of both
    signs at every shift it takes (33..62, |acc| < 2^31)."""
    acc, multiplier, shift = requantize_cases()
    taken = (shift >= 33) & (np.abs(acc) <= 2**31 - 1)
    acc, multiplier, shift = acc[taken], multiplier[taken], shift[taken]
    padding = -len(acc) % 4
    acc, multiplier, shift = (np.concatenate([a, a[:padding]]) for a in (acc, multiplier, shift))
    actual = run_requantize_loop("cortex-m55", {"acc": acc, "multiplier": multiplier, "shift": shift},
                                 "for (int32_t i = 0; i < COUNT; i += 4) {\n"
                                 "    vst1q_s32(result + i, dabuild_requantize32_mve(vld1q_s32(acc + i), "
                                 "vld1q_s32(multiplier + i), vld1q_s32(shift + i)));\n}", tmp_path)
    assert len(acc) > 500 and np.array_equal(actual, requantize(acc, multiplier, shift))


def tieless_cases() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(acc, multiplier, shift, offset) that never_ties admits: per random layer (a shift of 33..54, a multiplier
    with up to 12 trailing zero bits, a bound on |acc| of 2^8 to 2^31 - 1), the extremes of the bound, small
    sums and random ones, with output offsets -128..128."""
    rng = np.random.default_rng(33)
    cases: list[tuple[int, int, int, int]] = []
    while len(cases) < 2000:
        shift = int(rng.integers(33, 55))
        multiplier = int(rng.integers(2**18, 2**31)) >> int(rng.integers(0, 13)) << int(rng.integers(0, 13))
        multiplier = min(multiplier, 2**31 - 1)
        bound = int(rng.integers(2**8, 2**31))
        if not never_ties(np.array([bound]), np.array([multiplier]), np.array([shift])):
            continue
        accs = [bound, -bound, 0, 1, -1, *rng.integers(-bound, bound + 1, 12).tolist()]
        cases += [(acc, multiplier, shift, int(rng.integers(-128, 129))) for acc in accs]
    acc, multiplier, shift, offset = zip(*cases)
    return tuple(np.array(values, np.int64) for values in (acc, multiplier, shift, offset))  # type: ignore[return-value]


def test_a_sum_that_can_tie_is_not_tieless() -> None:
    """3 * 2^10 times 2^29 is 3 * 2^39, an odd multiple of 2^39: with shift 40 a tie, which rounding half up (the
    tieless form) takes the other way from dabuild's half away from zero for -2^29; a bound below 2^29 cannot
    reach it."""
    multiplier, shift, acc = 3 * 2**10, 40, -(2**29)
    half_up = (acc * multiplier + 2 ** (shift - 1)) >> shift
    assert half_up != int(requantize(np.array([acc]), np.array([multiplier]), np.array([shift]))[0])
    assert not never_ties(np.array([2**29]), np.array([multiplier]), np.array([shift]))
    assert never_ties(np.array([2**29 - 1]), np.array([multiplier]), np.array([shift]))
    assert not never_ties(np.array([100]), np.array([2**30]), np.array([32]))   # shift 32: no integer 2^(t-1)


@pytest.mark.parametrize("cpu", ["cortex-m0", "cortex-m4"])
def test_tieless_requantize_equals_the_reference_where_no_sum_ties(cpu: str, tmp_path: Path) -> None:
    """dabuild_requantize32_tieless (the product's high word plus 2^(t-1) + offset 2^t, shifted by t = shift - 32:
    SMMLA on the M4, C on the M0) in qemu, against the reference plus the offset on every case never_ties admits."""
    acc, multiplier, shift, offset = tieless_cases()
    actual = run_requantize_loop(cpu, {"acc": acc, "multiplier": multiplier, "shift": shift, "offset": offset},
                                 "for (int32_t i = 0; i < COUNT; ++i) {\n"
                                 "    result[i] = dabuild_requantize32_tieless(acc[i], multiplier[i], shift[i], offset[i]);\n}",
                                 tmp_path)
    assert np.array_equal(actual, requantize(acc, multiplier, shift) + offset)


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(set(CASES) - set(ISA_PATHS)))
def test_every_other_kernel_equals_the_integer_reference_in_qemu(case: str, tmp_path: Path) -> None:
    """The kernels without an ISA-specific loop, cross-compiled once (for the core whose helpers use Helium)."""
    actual, expected, manifest, _ = run_in_qemu(lowered(case), tmp_path, "cortex-m55")
    assert np.array_equal(actual, expected), f"{np.sum(actual != expected)} of {expected.size} outputs differ"
    expected_kernels = {"conv_rows" if name == "conv" else name for name in CASES[case][4]}
    assert expected_kernels <= set(manifest["kernels"].values())


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


@pytest.mark.parametrize("cpu", ("cortex-m3", "cortex-m4", "cortex-m55"))
@pytest.mark.parametrize("case", ["conv 3x3 pad 1 wide rows", "conv 1x1 no pad"])
def test_a_size_build_is_exact_in_qemu_and_smaller(case: str, cpu: str, tmp_path: Path) -> None:
    """At -Os conv_rows compiles one channel x one pixel and one shared requantization: the same bits, less text."""
    size_flags = [flag.replace("-O2", "-Os") for flag in STRICT]
    actual, expected, small, _ = run_in_qemu(lowered(case), tmp_path / "os", cpu, size_flags)
    assert np.array_equal(actual, expected), f"{np.sum(actual != expected)} of {expected.size} outputs differ"
    _, _, fast, _ = run_in_qemu(lowered(case), tmp_path / "o2", cpu)
    assert small["kernels"]["c"] == "conv_rows"
    assert small["firmware"]["text_bytes"] < fast["firmware"]["text_bytes"]


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
    qgraph = lowered("conv 1x1 int8 pairs")   # 128 x 272 weights: int16 on the host, int8 on a Cortex-M
    assert stored_bytes(qgraph, "host") - stored_bytes(qgraph, "cortex-m4") == 128 * 272


def test_a_small_layer_keeps_int16_weights_on_a_dsp_core() -> None:
    """conv_rows_dsp.j2 reads the weights of a layer of at most 32 KB as int16 on a DSP core (two loads a pair
    of inputs, no SXTB16), and as int8 on a core without the DSP extension."""
    qgraph = lowered("conv 1x1 no pad")   # 24 x 16 weights
    assert stored_bytes(qgraph, "cortex-m4") - stored_bytes(qgraph, "cortex-m0") == 24 * 16


def test_interleave_is_its_own_inverse_and_pairs_for_sxtb16() -> None:
    rows = np.arange(8).reshape(1, 8)
    assert interleave(rows).tolist() == [[0, 2, 1, 3, 4, 6, 5, 7]]
    assert np.array_equal(interleave(interleave(rows)), rows)


def test_wide_channel_paired_weights_are_the_pairs_smlad_takes() -> None:
    """conv_rows_dsp.j2's int16 weights: per channel pair and pair of widened inputs the words (c0 a, c0 b) and
    (c1 a, c1 b), so SMLAD of a loaded input word and each gives that channel's exact dot product."""
    rng = np.random.default_rng(6)
    weight, x = rng.integers(-128, 128, (4, 12)), rng.integers(-128, 128, 12)
    words = channel_paired_wide(interleave(weight.astype(np.int8))).astype(np.int64).reshape(2, 6, 2, 2)
    widened = interleave(x[None])[0].reshape(6, 2)
    sums = [[int(sum(widened[j] @ words[m, j, c] for j in range(6))) for c in (0, 1)] for m in range(2)]
    assert np.array_equal(np.array(sums).reshape(-1), weight @ x)


def test_channel_paired_weights_give_each_channel_its_pair_of_the_widened_input() -> None:
    """SXTB16 of a stored word is its bytes 0 and 2, ROR 8 its bytes 1 and 3; the input widens to (x0, x2, x1,
    x3) per 4: the SMLADs of conv_rows_dsp.j2 then sum each channel's exact dot product."""
    rng = np.random.default_rng(5)
    weight, x = rng.integers(-128, 128, (4, 12)), rng.integers(-128, 128, 12)
    words = channel_paired(interleave(weight.astype(np.int8))).astype(np.int64).reshape(2, 6, 4)   # channel, depth pairs
    widened = interleave(x[None])[0].reshape(6, 2)
    sums = [[int(sum(widened[j] @ words[m, j, [c, c + 2]] for j in range(6))) for c in (0, 1)] for m in range(2)]
    assert np.array_equal(np.array(sums).reshape(-1), weight @ x)


def test_sizes_and_options_are_validated() -> None:
    budget = CTarget.Options(cpu="cortex-m4", budget={"flash": "64KB", "ram": "2M"}).budget
    assert budget is not None and (budget.flash, budget.ram) == (65536, 2 * 1024**2)  # dabuild.sizes: binary
    with pytest.raises(ValueError, match="is not a size"):
        CTarget.Options(cpu="cortex-m4", budget={"flash": "64 furlongs"})
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
    command = ["sh", "-c", ("qemu-system-arm -M mps2-an386 -nographic -monitor none -serial none "
               "-semihosting-config enable=on,target=native -kernel {image}")]
    actual, expected, _, _ = run_in_qemu(lowered("conv 3x3 pad 1"), tmp_path, "cortex-m4", runner="command",
                                         command=command)
    assert np.array_equal(actual, expected)


@pytest.mark.parametrize("features", [37, 20])
def test_int4_dense_weights_are_packed_two_per_byte_and_exact(features: int, tmp_path: Path) -> None:
    nodes, _, _constants, _, _ = CASES["dense per channel relu6"]
    graph = graph_of(nodes, (features,), {"w": weights(features, 5), "b": weights(5)})
    config = with_weights(default_config(graph, C_CAPABILITY), dtype="int4", granularity="per_channel")
    qgraph = lower(graph, image(128, (features,), seed=3) * 2, config)
    actual, expected, _manifest, _ = run_in_qemu(qgraph, tmp_path, "cortex-m4")
    assert np.array_equal(actual, expected)
    rows = 5 * -(-features // 2)   # packed bytes: half of the int8 weights, rounded up per row
    assert stored_bytes(qgraph, "host") - stored_bytes(qgraph, "cortex-m4") == 5 * features - rows


@pytest.mark.parametrize("cpu", VARIANTS)
def test_int4_conv_weights_are_packed_two_per_byte_and_exact(cpu: str, tmp_path: Path) -> None:
    """conv_rows packs each kernel row's 4-bit weights two per byte (an odd row padded): exact on every variant,
    and the size objective counts the packed bytes."""
    nodes = CASES["conv 3x3 pad 1 wide rows"][0]
    graph = graph_of(nodes, (3, 5, 5), {"c_w": weights(5, 3, 3, 3), "c_b": weights(5)})  # rows of 9 weights
    config = with_weights(default_config(graph, C_CAPABILITY), dtype="int4", granularity="per_channel")
    qgraph = lower(graph, image(128, (3, 5, 5), seed=3) * 2, config)
    actual, expected, manifest, target = run_in_qemu(qgraph, tmp_path, cpu)
    assert np.array_equal(actual, expected), f"{np.sum(actual != expected)} of {expected.size} outputs differ"
    assert manifest["kernels"]["c"] == "conv_rows"
    # 5 outputs (padded to 6 for the channel blocks) x 3 kernel rows of 9 weights: 5 bytes a row, not 9
    assert "static const uint8_t l_c_weight[90]" in (tmp_path / "artifact" / "layer_c.h").read_text()
    assert manifest["weight_bytes"] == target.stored_bytes(qgraph) == stored_bytes(qgraph, cpu)
    int8 = lower(graph, image(128, (3, 5, 5), seed=3) * 2, with_weights(default_config(graph, C_CAPABILITY),
                                                                      dtype="int8", granularity="per_channel"))
    assert target.stored_bytes(int8) - target.stored_bytes(qgraph) >= 6 * 27 - 90   # what the size objective sees
    host = CTarget(CTarget.Options(cpu=cpu, cflags=STRICT, runner="host"))   # the same sources on this machine
    (tmp_path / "host").mkdir()
    x_q = np.random.default_rng(31).integers(-128, 128, (SAMPLES, 3, 5, 5)).astype(np.int8)
    assert np.array_equal(host.run(tmp_path / "artifact", x_q, tmp_path / "host"), expected)


def _budget_recipe(folder: Path, budget: str) -> None:
    """The digits MLP tuned for one Cortex-M4 target on a capability whose default is per-channel weights."""
    capability = (REPO / "capabilities" / "c.yaml").read_text().replace("name: c\n", "name: c-m4\n")
    (folder / "c-m4.yaml").write_text(capability.replace("granularity: [per_tensor, per_channel]",
                                                         "granularity: [per_channel, per_tensor]"))
    text = (REPO / "recipes" / "digits" / "recipe.yaml").read_text()
    (folder / "recipe.yaml").write_text(text[:text.index("targets:")] + f"""capabilities: [c-m4.yaml]
targets:
  - name: m4
    kind: c
    capability: c-m4
    options: {{cpu: cortex-m4{budget}}}
    check_io: {{tolerance: exact, samples: 20}}
""")


def _tuned(build: Path) -> tuple[str, int, list[bool]]:
    """The chosen config's hash, the exported image's flash, and whether each trial passed."""
    root = build / "digits-mlp"
    trials = [json.loads(line)["passed"] for line in (root / "history" / "tune-c-m4.jsonl").read_text().splitlines()]
    flash = json.loads((root / "export-m4" / "model.json").read_text())["firmware"]["flash_bytes"]
    return json.loads((root / "tune-c-m4" / "metrics.json").read_text())["config_hash"], flash, trials


@pytest.mark.slow
def test_a_flash_budget_changes_the_tuners_choice(digits: Path, tmp_path: Path, cache_dir: Path) -> None:
    _budget_recipe(digits, "")
    assert main(["build", str(digits), "--build-dir", str(tmp_path / "free"), "-q"]) == 0
    free_choice, free_flash, free_trials = _tuned(tmp_path / "free")
    assert free_trials[0]  # the default (per-channel int8) meets the goal and is what it takes

    limit = free_flash - 100
    _budget_recipe(digits, f", budget: {{flash: {limit}}}")
    assert main(["build", str(digits), "--build-dir", str(tmp_path / "tight"), "-q"]) == 0
    choice, flash, trials = _tuned(tmp_path / "tight")
    assert choice != free_choice and flash <= limit
    assert not trials[0]  # the same default meets the goal but not the budget



@pytest.mark.slow
def test_a_budget_no_config_meets_fails_tuning_naming_the_smallest(digits: Path, tmp_path: Path, cache_dir: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    _budget_recipe(digits, ", budget: {flash: 600}")
    recipe = digits / "recipe.yaml"  # no config fits: the search runs to its end, so a short one
    recipe.write_text(recipe.read_text().replace("  strategy: basic\n", "  strategy: basic\n  max_trials: 6\n"))
    assert main(["build", str(digits), "--build-dir", str(tmp_path / "build"), "-q"]) == 1
    assert re.search(r"tune:c-m4: no config that meets the accuracy goal fits the targets' budgets; the smallest "
                     r"artifact found \(trial \d+, .*\): cortex-m4: flash \d+ bytes exceeds the budget of 600 by \d+",
                     capsys.readouterr().err)


def _hard_swish_cnn(folder: Path, options: str) -> None:
    """A conv with a fused hard_swish and a dense head on the digits data, as ONNX, tuned for one Cortex-M4
    target with these further `options` (a budget)."""
    pytest.importorskip("onnx", reason="the model is an ONNX file: needs dabuild[onnx]")
    from onnx import TensorProto, helper, numpy_helper, save

    rng = np.random.default_rng(5)
    initializers = [numpy_helper.from_array(np.array([-1, 1, 8, 8], np.int64), "shape"),
                    numpy_helper.from_array(rng.normal(0, 0.5, (4, 1, 3, 3)).astype(np.float32), "conv_w"),
                    numpy_helper.from_array(rng.normal(0, 0.1, 4).astype(np.float32), "conv_b"),
                    numpy_helper.from_array(rng.normal(0, 0.2, (256, 10)).astype(np.float32), "dense_w"),
                    numpy_helper.from_array(rng.normal(0, 0.1, 10).astype(np.float32), "dense_b")]
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["image"]),
             helper.make_node("Conv", ["image", "conv_w", "conv_b"], ["conv"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("HardSwish", ["conv"], ["swish"]),
             helper.make_node("Flatten", ["swish"], ["flat"]),
             helper.make_node("Gemm", ["flat", "dense_w", "dense_b"], ["y"], name="dense")]
    graph = helper.make_graph(nodes, "hard_swish_cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 10])], initializers)
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), folder / "model.onnx")
    shutil.copy(REPO / "recipes" / "digits" / "data.npz", folder / "data.npz")
    (folder / "c-m4.yaml").write_text((REPO / "capabilities" / "c.yaml").read_text().replace("name: c\n",
                                                                                          "name: c-m4\n"))
    (folder / "recipe.yaml").write_text(f"""name: swish
model: {{framework: onnx, source: model.onnx}}
data:
  calibration: {{source: data.npz, x: x_train, samples: 64}}
  evaluation: {{source: data.npz, x: x_test, y: y_test}}
  metric: accuracy
tuning: {{strategy: basic, max_trials: 4, accuracy: {{criterion: absolute, tolerable_loss: 1.0}}}}
capabilities: [c-m4.yaml]
targets:
  - name: m4
    kind: c
    capability: c-m4
    options: {{cpu: cortex-m4{options}}}
    check_io: {{tolerance: exact, samples: 2}}
""")


def test_a_budget_no_config_of_a_hard_swish_cnn_meets_ends_in_tune_naming_the_smallest(
        tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The newcomer's case (issue 23): a conv with a fused hard_swish under a flash budget nothing meets. The build
    ends in the tune stage (exit 1) naming the smallest artifact and its sizes; no trial made the conv a float
    island (the c target has no float hard_swish), and nothing was exported or checked."""
    folder = tmp_path / "swish"
    folder.mkdir()
    _hard_swish_cnn(folder, ", budget: {flash: 600}")
    assert main(["build", str(folder), "--build-dir", str(tmp_path / "build"), "-q"]) == 1
    err = capsys.readouterr().err
    assert re.search(r"tune:c-m4: no config that meets the accuracy goal fits the targets' budgets; the smallest "
                     r"artifact found \(trial \d+, size \d+ bytes\): cortex-m4: flash \d+ bytes exceeds the budget "
                     r"of 600 by \d+", err), err
    assert "float_weighted" not in err and "Traceback" not in err
    history = [json.loads(line) for line in
               (tmp_path / "build" / "swish" / "history" / "tune-c-m4.jsonl").read_text().splitlines()]
    assert history and not any(t["passed"] for t in history)
    assert not (tmp_path / "build" / "swish" / "export-m4").exists()


def test_a_target_failing_to_build_a_trial_names_the_tune_stage(
        tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A budgeted target that cannot build a trial's artifact while the tuner fits it (here its cross compiler
    refuses a flag of the recipe's): the error names the tune stage before the target's own reason."""
    folder = tmp_path / "swish"
    folder.mkdir()
    _hard_swish_cnn(folder, ", cflags: [-mno-such-option], budget: {flash: 600}")
    assert main(["build", str(folder), "--build-dir", str(tmp_path / "build"), "-q"]) == 1
    err = capsys.readouterr().err
    assert re.search(r"^(dabuild: error: )?tune:c-m4: the target could not build a trial's artifact: .*"
                     r"unrecognized command-line option '-mno-such-option'", err, re.MULTILINE | re.DOTALL), err
    assert "Traceback" not in err
