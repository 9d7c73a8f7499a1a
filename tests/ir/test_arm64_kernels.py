"""The native float conv's arm64 (NEON) path against numpy: conv.c cross-compiled with gcc-aarch64-linux-gnu and
run under qemu-aarch64 (Debian's qemu-user) through tests/arm64/conv_driver.c, which reads and writes raw arrays.

An x86 machine cannot run the NEON path natively; this checks it computes the op cases of
tests/ir/test_native_kernels.py (ungrouped, grouped and depthwise 2-D convs, partial vectors, pads, strides,
dilations)
within float tolerance of the numpy reference. Instruction counts against onnxruntime's aarch64 build are not
measured here.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from test_native_kernels import CASES, assert_close

from dabuild.ir.kernels import native
from dabuild.ir.kernels.native import pack_weight
from dabuild.ir.ops import OPS

CROSS, EMULATOR = "aarch64-linux-gnu-gcc", "qemu-aarch64"
DRIVER = Path(__file__).resolve().parents[1] / "arm64" / "conv_driver.c"
KERNELS = Path(native.__file__).parent

pytestmark = pytest.mark.skipif(shutil.which(CROSS) is None or shutil.which(EMULATOR) is None,
                                reason=f"no {CROSS} or {EMULATOR} (apt-get install gcc-aarch64-linux-gnu qemu-user)")


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """conv_driver.c and conv.c compiled for arm64 (static, so qemu needs no arm64 libraries)."""
    binary = tmp_path_factory.mktemp("arm64") / "conv_driver"
    subprocess.run([CROSS, "-O3", "-static", "-I", str(KERNELS), "-o", str(binary), str(DRIVER)], check=True)
    return binary


@pytest.fixture(scope="module")
def layout(driver: Path) -> tuple[str, int, int]:
    """The path the arm64 build chose, its vector bytes and conv block vectors (vector_path.c)."""
    path, vector_bytes, block_vectors = subprocess.run([EMULATOR, str(driver), "info"], capture_output=True,
                                                       text=True, check=True).stdout.split()
    return path, int(vector_bytes), int(block_vectors)


def test_arm64_builds_the_neon_path(layout: tuple[str, int, int]) -> None:
    assert layout == ("neon", 16, 4)


TWO_D = [case for case in CASES if len(case[3]) == 2]


@pytest.mark.parametrize("case", TWO_D)
@pytest.mark.parametrize("activation", ["relu", "none"])
def test_neon_conv_matches_numpy(driver: Path, layout: tuple[str, int, int], tmp_path: Path,
                                 monkeypatch: pytest.MonkeyPatch, case: tuple, activation: str) -> None:
    batch, channels, out_channels, size, kernel, strides, pads, dilations, groups = case
    depthwise = groups == channels == out_channels and groups > 1
    rng = np.random.default_rng(channels * 100 + out_channels)
    x = rng.standard_normal((batch, channels, *size)).astype(np.float32)
    weight = (rng.standard_normal((out_channels, channels // groups, *kernel))
              / np.sqrt(channels // groups * np.prod(kernel))).astype(np.float32)
    bias = rng.standard_normal(out_channels).astype(np.float32)
    monkeypatch.setenv(native.SWITCH, "0")
    attrs = {"strides": strides, "pads": pads, "dilations": dilations, "groups": groups, "activation": activation}
    reference = OPS["conv"].run([x, weight, bias], attrs)[0]
    _, vector_bytes, block_vectors = layout
    conv_groups = 1 if depthwise else groups  # conv.c's groups: a depthwise conv is one of its own kind
    taps, padded = pack_weight(weight, depthwise, vector_bytes, block_vectors, conv_groups)
    out = reference.shape[2:]
    group_out = out_channels // conv_groups
    padding = np.zeros((conv_groups, padded - group_out), np.float32)
    files = {"x": x.transpose(0, 2, 3, 1), "w": taps,
             "b": np.concatenate([bias.reshape(conv_groups, group_out), padding], 1)}
    for name, array in files.items():
        np.ascontiguousarray(array, np.float32).tofile(tmp_path / name)
    geometry = [batch, *size, channels // conv_groups, *kernel, group_out, padded, *out, *strides, pads[0], pads[1],
                *dilations, 1 if activation == "relu" else 0, int(depthwise), 1, conv_groups]
    subprocess.run([EMULATOR, str(driver), "conv", *map(str, geometry), *(str(tmp_path / n) for n in "xwby")],
                   check=True, timeout=300)
    compiled = np.fromfile(tmp_path / "y", np.float32).reshape(batch, *out, out_channels).transpose(0, 3, 1, 2)
    assert_close(np.ascontiguousarray(compiled), reference)
