"""The C target on 16x8 QGraphs (int16 activations, int8 weights, int64 sums), from the committed 16x8 .tflite files.

Its int16 layers take the portable kernels of dabuild/targets/c/kernels/wide.py on every CPU: on the host, in each
rounding, the outputs equal the integer reference's; with rounding tflm they equal TFLite Micro's too, on the host
and on a Cortex-M4 and an M55 in qemu, where dense and conv layers with an int16 input of zero point 0 take
wide_dense_mcu and wide_conv_mcu (SMLAD and Helium dot products) and the rest the portable kernels (the manifest's
kernels say which ran).
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tflite_micro", reason="needs the tflite extra: pip install 'dabuild[tflite]'")

from tflite_runtime import given_qgraph, inputs_for, model, run_tflm

from dabuild.qir.qgraph import QGraph
from dabuild.qir.reference import quantize_input, run_integer
from dabuild.quant.config import QuantConfig
from dabuild.targets.c import CTarget, read_manifest


def built(target: CTarget, qgraph: QGraph, folder: Path) -> Path:
    artifact = folder / "artifact"
    artifact.mkdir()
    target.export(target.integer_graph(qgraph), artifact)
    return artifact


@pytest.mark.parametrize("rounding", ["dabuild", "tflm", "tflm-single"])
def test_resnet_block_16x8_in_c_equals_the_reference_and_with_tflm_rounding_tflm(rounding: str,
                                                                                  tmp_path: Path) -> None:
    """Transpose, convs with fused relu, a residual add, max pool, mean and fully connected, all int16."""
    path = model("resnet_block_16x8")
    _, qgraph = given_qgraph(path)
    x = inputs_for(path, 8, seed=11)
    target = CTarget(CTarget.Options(rounding=rounding))
    artifact = built(target, qgraph, tmp_path)
    assert {"wide_conv", "wide_add", "wide_max_pool", "wide_mean", "wide_dense"} <= set(
        read_manifest(artifact)["kernels"].values())
    x_q = quantize_input(qgraph, x)
    ours = target.run(artifact, x_q, tmp_path)
    assert ours.dtype == np.int16
    reference = run_integer(target.integer_graph(qgraph), x_q)
    assert np.array_equal(ours, reference.reshape(ours.shape))
    if rounding == "tflm":
        expected = run_tflm(path, qgraph, x)["output"]
        assert np.array_equal(ours.reshape(expected.shape), expected)


@pytest.mark.parametrize("cpu", ["host", "cortex-m4"])
def test_ds_cnn_16x8_with_its_int16_softmax_in_c_equals_tflm(cpu: str, tmp_path: Path) -> None:
    """Depthwise and pointwise convs, TFLM's dividing average pool, the fully connected layer and TFLite's int16
    softmax (exp and reciprocal tables) of the 16x8 DS-CNN: the C target (rounding tflm) gives TFLM's int16
    probabilities, on the host and (where its toolchain and qemu are here) on a Cortex-M4."""
    if cpu != "host" and (shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None):
        pytest.skip("needs gcc-arm-none-eabi, libnewlib-arm-none-eabi and qemu-system-arm")
    path = model("ds_cnn_16x8")
    _, qgraph = given_qgraph(path)
    x = inputs_for(path, 8, seed=12)
    expected = run_tflm(path, qgraph, x)["output"]
    target = CTarget(CTarget.Options(cpu=cpu, rounding="tflm"))
    artifact = built(target, qgraph, tmp_path)
    assert "wide_softmax" in read_manifest(artifact)["kernels"].values()
    ours = target.run(artifact, quantize_input(qgraph, x), tmp_path)
    assert np.array_equal(ours.reshape(expected.shape), expected)


QEMU = pytest.mark.skipif(shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None,
                          reason="needs gcc-arm-none-eabi, libnewlib-arm-none-eabi and qemu-system-arm")


@QEMU
@pytest.mark.parametrize("cpu", ["cortex-m4", "cortex-m55"])
def test_cortex_m_16x8_dense_and_conv_take_the_isa_kernels_and_equal_tflm(cpu: str, tmp_path: Path) -> None:
    """The ResNet block's convs and fully connected layer run wide_conv_mcu and wide_dense_mcu (SMLAD on the M4,
    Helium on the M55), the rest the portable 16-bit kernels: TFLM's int16 outputs, in qemu."""
    path = model("resnet_block_16x8")
    _, qgraph = given_qgraph(path)
    x = inputs_for(path, 6, seed=13)
    target = CTarget(CTarget.Options(cpu=cpu, rounding="tflm"))
    artifact = built(target, qgraph, tmp_path)
    kernels = set(read_manifest(artifact)["kernels"].values())
    assert {"wide_conv_mcu", "wide_dense_mcu"} <= kernels and "wide_conv" not in kernels, kernels
    assert all(name.startswith("wide_") for name in kernels), kernels
    actual = target.run(artifact, quantize_input(qgraph, x), tmp_path)
    expected = run_tflm(path, qgraph, x)["output"]
    assert np.array_equal(actual.reshape(expected.shape), expected)


def symmetric_int16(config: QuantConfig, *names: str) -> QuantConfig:
    """`config` with the activations of the nodes `names` int16, symmetric (zero point 0, TFLite's 16x8)."""
    return QuantConfig({name: dataclasses.replace(node, activation=dataclasses.replace(
        node.activation, dtype="int16", scheme="sym")) if name in names and node.activation else node
        for name, node in config.nodes.items()})


def isa_kernel_graph() -> tuple[QGraph, np.ndarray]:
    """conv 3x7x9 -> 30 (3x3, padded) -> conv 30 -> 6 (3x3, stride 2, padded; a window of 270 taps: more than one
    int32 chunk of dabuild_wide_dot4, 270 = 33 * 8 + 6 = 67 * 4 + 2, and 6 = 4 + 2 outputs) -> conv 6 -> 4 in 2
    groups (dilated 2, padded unevenly: the portable kernel on every cpu) -> flatten -> dense 48 -> 10 (48 = 6 * 8
    = 12 * 4, 10 = 2 * 4 + 2) -> dense 10 -> 5 (shorter than a vector: the tail alone), every activation int16
    symmetric: the ISA kernels' chunks and tails, with the portable ones' rounding."""
    from test_lowering import graph_of, lower
    from test_quantize import C_CAPABILITY

    from dabuild.ir.graph import Node
    from dabuild.quant.defaults import default_config

    rng = np.random.default_rng(5)
    nodes = [Node("c1", "conv", ["x", "w1"], ["h"], {"pads": [1] * 4, "activation": "relu"}),
             Node("c2", "conv", ["h", "w2"], ["h2"], {"pads": [1] * 4, "strides": [2, 2]}),
             Node("c3", "conv", ["h2", "w5"], ["h3"], {"pads": [2, 1, 1, 2], "dilations": [2, 2], "groups": 2}),
             Node("flat", "flatten", ["h3"], ["f"], {}),
             Node("fc1", "dense", ["f", "w3", "b3"], ["g"], {}),
             Node("fc2", "dense", ["g", "w4", "b4"], ["y"], {})]
    graph = graph_of(nodes, (3, 7, 9), {"w1": rng.normal(0, 0.5, (30, 3, 3, 3)), "w2": rng.normal(0, 0.2, (6, 30, 3, 3)),
                                        "w5": rng.normal(0, 0.4, (4, 3, 3, 3)), "w3": rng.normal(0, 0.3, (48, 10)), "b3": rng.normal(0, 0.1, 10),
                                        "w4": rng.normal(0, 0.5, (10, 5)), "b4": rng.normal(0, 0.1, 5)})
    x = rng.normal(size=(40, 3, 7, 9)).astype(np.float32)
    config = symmetric_int16(default_config(graph, C_CAPABILITY), "c1", "c2", "c3", "flat", "fc1", "fc2")
    return lower(graph, x, config), x


@pytest.mark.parametrize("rounding", ["dabuild", "tflm", "tflm-single"])
@pytest.mark.parametrize("cpu", ["host", "cortex-m4", "cortex-m55"])
def test_16x8_dense_and_conv_kernels_equal_the_reference_in_every_rounding(cpu: str, rounding: str,
                                                                           tmp_path: Path) -> None:
    """wide_conv_mcu and wide_dense_mcu over chunked and tailed dot products (M4 and M55, in qemu), the portable
    wide_conv and wide_dense (the host; a grouped, dilated conv everywhere), against the integer reference in
    each rounding; one sample alternates int16's extremes, -32768 and 32767."""
    if cpu != "host" and (shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None):
        pytest.skip("needs gcc-arm-none-eabi, libnewlib-arm-none-eabi and qemu-system-arm")
    qgraph, x = isa_kernel_graph()
    target = CTarget(CTarget.Options(cpu=cpu, rounding=rounding))
    artifact = built(target, qgraph, tmp_path)
    kernels = read_manifest(artifact)["kernels"]
    isa = "" if cpu == "host" else "_mcu"
    assert [kernels[name] for name in ("c1", "c2", "c3", "fc1", "fc2")] == [
        f"wide_conv{isa}", f"wide_conv{isa}", "wide_conv", f"wide_dense{isa}", f"wide_dense{isa}"]
    x_q = quantize_input(qgraph, x[:4])
    x_q[0] = np.where(np.arange(x_q[0].size).reshape(x_q[0].shape) % 2, -32768, 32767)
    expected = run_integer(target.integer_graph(qgraph), x_q)
    actual = target.run(artifact, x_q, tmp_path)
    assert np.array_equal(actual, expected.reshape(actual.shape)), f"{np.sum(actual != expected.reshape(actual.shape))} differ"


def floor_product_cases() -> list[tuple[int, int, int, int]]:
    """(acc, multiplier, addend, shift) around int32's edges (where dabuild_floor_product's one-multiply path ends)
    and beyond, at every shift 1..62, with the addends the requantizations pass (0, a rounding half, 2^30)."""
    rng = np.random.default_rng(8)
    accs = [0, 1, -1, 2**31 - 1, -(2**31), 2**31, -(2**31) - 1, 2**40 + 3, -(2**47) + 5,
            *map(int, rng.integers(-(2**31), 2**31, 6)), *map(int, rng.integers(-(2**50), 2**50, 4))]
    cases = []
    for shift in range(1, 63):
        for acc in accs:
            for multiplier in (1, 2**31 - 1, int(rng.integers(1, 2**31))):
                for addend in {0, 2 ** (shift - 1), 2**30}:
                    exact = (acc * multiplier + addend) >> shift
                    if shift < 32 or abs(exact) <= 2**61:   # from shift 32 on, the function takes no saturation
                        cases.append((acc, multiplier, addend, shift))
    return cases


def test_wide_floor_product_is_exact_on_both_of_its_paths(tmp_path: Path) -> None:
    """dabuild_floor_product, which every 16-bit requantization calls, on the host: floor((acc * multiplier +
    addend) / 2^shift) computed in Python's integers, saturated at +-2^61 as the function states."""
    from test_c_kernels import lowered

    from dabuild.targets.c.codegen import render

    for name, text in render(lowered("relu")).files.items():
        if name.endswith(".h"):
            (tmp_path / name).write_text(text)
    cases = floor_product_cases()
    rows = ",\n".join(f"{{{a}LL, {m}, {d}LL, {s}}}" for a, m, d, s in cases)
    (tmp_path / "check.c").write_text(f"""#include <stdio.h>
#include "dabuild_wide.h"
static const struct {{ int64_t acc; int32_t multiplier; int64_t addend; int32_t shift; }} cases[] = {{
{rows}
}};
int main(void)
{{
    size_t i;
    for (i = 0; i < sizeof cases / sizeof cases[0]; ++i) {{
        printf("%lld\\n", (long long)dabuild_floor_product(cases[i].acc, cases[i].multiplier, cases[i].addend,
                                                         cases[i].shift));
    }}
    return 0;
}}
""")
    subprocess.run(["cc", "-std=c99", "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(tmp_path / "check"),
                    str(tmp_path / "check.c")], check=True)
    printed = subprocess.run([str(tmp_path / "check")], capture_output=True, text=True, check=True).stdout
    expected = [min(max((a * m + d) >> s, -(2**61)), 2**61) for a, m, d, s in cases]
    assert len(cases) > 5000 and [int(value) for value in printed.split()] == expected
