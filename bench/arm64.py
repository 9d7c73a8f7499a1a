"""dabuild's native float conv on arm64 against onnxruntime's aarch64 build: instructions per layer under qemu.

Neither runs natively here: both are aarch64 code run by qemu-aarch64 (user mode, `-cpu neoverse-n1`: an
Arm Neoverse N1, AWS Graviton2's core, NEON with 128-bit vectors and no SVE), and a TCG plugin the bench
compiles (bench/arm64/count_plugin.c) counts the instructions each executes. Counts do not depend on the
machine's load; they are not cycles (an emulator models no pipeline), but both sides are counted alike.

- dabuild: the library's units as native.py builds them, cross-compiled with gcc-aarch64-linux-gnu (the NEON
  path, -O3 for generic armv8-a: a native build adds -march=native), called through
  tests/arm64/kernel_driver.c (static) with the weight packed as the interpreter packs it; channels-last.
- onnxruntime: the user's libonnxruntime.so for arm64 Linux (the path is the one argument; e.g. npm's
  onnxruntime-node 1.20.1 ships bin/napi-v3/linux/arm64/libonnxruntime.so.1.20.1), loaded by
  bench/arm64/ort_driver.c with one thread, running a one-Conv ONNX model (NCHW, every graph optimisation).

Each side runs its layer once and three times in one process; (three - once) / 2 is one layer's
instructions, without the process start, reading the inputs, loading or preparing the session. Both get the
same input, weights and bias, and their outputs are compared. Layers: ResNet-50's 3x3 and 1x1 convs at
56x56 and MobileNetV2's 3x3 depthwise conv at 56x56.

Usage: python bench/arm64.py /path/to/libonnxruntime.so
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "ir"))
from arm64_kernels import CROSS, EMULATOR, MISSING, Arm64Kernels, build_driver

from dabuild.ir.kernels import native
from dabuild.ir.kernels.native import pack_weight

HERE = Path(__file__).resolve().parent / "arm64"
CPU = "neoverse-n1"
SYSROOT = "/usr/aarch64-linux-gnu"  # Debian's arm64 libraries for the dynamically linked onnxruntime driver
HOST_COMPILER = "cc"


@dataclass(frozen=True)
class Layer:
    """One conv: its name, channels, output channels, input size, kernel, stride, pad and groups."""

    name: str
    channels: int
    out_channels: int
    size: int
    kernel: int
    stride: int
    pad: int
    groups: int = 1

    @property
    def out(self) -> int:
        return (self.size + 2 * self.pad - self.kernel) // self.stride + 1

    @property
    def macs(self) -> int:
        return self.out ** 2 * self.out_channels * self.kernel ** 2 * self.channels // self.groups


LAYERS = [Layer("ResNet-50 3x3 conv 64->64 at 56x56", 64, 64, 56, 3, 1, 1),
          Layer("ResNet-50 1x1 conv 64->256 at 56x56", 64, 256, 56, 1, 1, 0),
          Layer("MobileNetV2 3x3 depthwise conv 144 at 56x56", 144, 144, 56, 3, 1, 1, groups=144)]


def emulator(plugin: Path) -> list[str]:
    return [EMULATOR, "-cpu", CPU, "-L", SYSROOT, "-plugin", str(plugin)]


def counted(command: list[str], stdin: bytes) -> tuple[int, bytes, str]:
    """(instructions the plugin counted, stdout, stderr) of one run under qemu."""
    result = subprocess.run(command, input=stdin, capture_output=True, check=True, timeout=3600)
    errors = result.stderr.decode()
    words = [line.split() for line in errors.splitlines() if line.startswith("instructions ")]
    return int(words[-1][1]), result.stdout, errors


def per_run(command: list[str], times_at: int, stdin: bytes) -> tuple[int, bytes, str]:
    """Instructions of one run of the layer (a process running it 3 times less one running it once, halved), and
    the stdout and stderr of the process that ran it once."""
    once, output, errors = counted([*command[:times_at], "1", *command[times_at + 1:]], stdin)
    thrice, _, _ = counted([*command[:times_at], "3", *command[times_at + 1:]], stdin)
    return (thrice - once) // 2, output, errors


def onnx_conv(layer: Layer, weight: np.ndarray, bias: np.ndarray, path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[layer.kernel] * 2,
                            strides=[layer.stride] * 2, pads=[layer.pad] * 4, group=layer.groups)
    graph = helper.make_graph(
        [node], "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, layer.channels, layer.size,
                                                                                  layer.size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, layer.out_channels, layer.out, layer.out])],
        [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)


def dabuild_conv(kernels: Arm64Kernels, plugin: Path, layer: Layer, x: np.ndarray, weight: np.ndarray,
                 bias: np.ndarray) -> tuple[int, np.ndarray]:
    """(instructions of one run, (1, O, OH, OW) output) of conv.c's NEON kernel on the layer."""
    depthwise = layer.groups > 1
    layout = kernels.layout
    taps, padded = pack_weight(weight, depthwise, layout.vector_bytes, layout.block_vectors)
    inputs = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    padded_bias = np.zeros(padded, np.float32)
    padded_bias[:layer.out_channels] = bias
    zeros = np.zeros(layer.channels, np.float32)
    y = np.zeros((1, layer.out, layer.out, layer.out_channels), np.float32)
    call = native.ELEMENTS[np.dtype(np.float32)][1](
        inputs.ctypes.data, layer.size, layer.size, layer.channels, taps.ctypes.data,
        layer.kernel, layer.kernel, layer.out_channels, padded, padded_bias.ctypes.data, None, y.ctypes.data,
        layer.out, layer.out, layer.stride, layer.stride, layer.pad, layer.pad, 1, 1, 0, 0.0, 0.0,
        zeros.ctypes.data, 1, layer.out, 1)
    function = "depthwise2d_nhwc_f32" if depthwise else "conv2d_nhwc_f32"
    request, arrays = kernels.request(function, [call, 0, layer.out], [inputs, taps, padded_bias, y, zeros])
    command = [*emulator(plugin), str(kernels.binary), "call", "times"]
    instructions, response, _ = per_run(command, len(command) - 1, request)
    kernels.unpack(function, response, arrays)
    return instructions, y.transpose(0, 3, 1, 2)


def onnxruntime_conv(driver: Path, library: Path, plugin: Path, layer: Layer, x: np.ndarray, weight: np.ndarray,
                     bias: np.ndarray, folder: Path) -> tuple[int, np.ndarray, str]:
    """(instructions of one run, output, version) of onnxruntime's Conv on the layer."""
    model = folder / "conv.onnx"
    onnx_conv(layer, weight, bias, model)
    count = layer.out_channels * layer.out ** 2
    command = [*emulator(plugin), str(driver), str(library), str(model), "times", "x", "y", str(count),
               *map(str, x.shape)]
    instructions, output, errors = per_run(command, command.index("times"), x.tobytes())
    version = next(line for line in errors.splitlines() if line.startswith("onnxruntime "))
    return instructions, np.frombuffer(output, np.float32).reshape(1, layer.out_channels, layer.out, layer.out), version


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("onnxruntime", type=Path, help="libonnxruntime.so built for arm64 Linux")
    args = parser.parse_args()
    missing = [*MISSING, *(() if shutil.which(HOST_COMPILER) else (HOST_COMPILER,))]
    if missing:
        print(f"bench/arm64.py: needs {', '.join(missing)} (apt-get install gcc-aarch64-linux-gnu qemu-user)",
              file=sys.stderr)
        return 2
    if not args.onnxruntime.is_file():
        print(f"bench/arm64.py: {args.onnxruntime}: no such file (an onnxruntime library for arm64 Linux)",
              file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="dabuild-arm64-") as work:
        folder = Path(work)
        plugin, driver = folder / "count_plugin.so", folder / "ort_driver"
        subprocess.run([HOST_COMPILER, "-O2", "-shared", "-fPIC", "-o", str(plugin), str(HERE / "count_plugin.c")],
                       check=True)
        subprocess.run([CROSS, "-O2", "-o", str(driver), str(HERE / "ort_driver.c"), "-ldl"], check=True)
        kernels = Arm64Kernels(build_driver(folder))
        version = subprocess.run([EMULATOR, "--version"], capture_output=True, text=True, check=True).stdout.partition("\n")[0]
        print(f"CPU: emulated aarch64, {version}, -cpu {CPU} (Arm Neoverse N1: NEON, 128-bit vectors); instructions "
              f"counted by a TCG plugin, 1 thread, batch 1; dabuild's {kernels.layout.path} path "
              f"({kernels.layout.vector_bytes}-byte vectors, {CROSS} -O3) against {args.onnxruntime}; ratio = "
              "dabuild's instructions / onnxruntime's (below 1: fewer)")
        rng = np.random.default_rng(0)
        for layer in LAYERS:
            x = rng.standard_normal((1, layer.channels, layer.size, layer.size)).astype(np.float32)
            weight = (rng.standard_normal((layer.out_channels, layer.channels // layer.groups, layer.kernel,
                                           layer.kernel)) / np.sqrt(layer.channels // layer.groups * layer.kernel ** 2)
                      ).astype(np.float32)
            bias = rng.standard_normal(layer.out_channels).astype(np.float32)
            ours, y = dabuild_conv(kernels, plugin, layer, x, weight, bias)
            theirs, reference, peer = onnxruntime_conv(driver, args.onnxruntime, plugin, layer, x, weight, bias,
                                                       folder)
            differ = float(np.max(np.abs(y - reference)) / (np.max(np.abs(reference)) or 1.0))
            print(f"{layer.name} ({layer.macs / 1e6:.1f}M multiply-adds): dabuild {ours:,} instructions, {peer} "
                  f"{theirs:,}, ratio {ours / theirs:.2f}x; outputs differ by {differ:.1e} of their peak")
    return 0


if __name__ == "__main__":
    sys.exit(main())
