"""dabuild's native kernels on arm64 against onnxruntime's aarch64 build: instructions per layer under qemu.

Neither runs natively here: both are aarch64 code run by qemu-aarch64 (user mode, `-cpu neoverse-n1`: an
Arm Neoverse N1, AWS Graviton2's core, NEON with 128-bit vectors and no SVE), and a TCG plugin the bench
compiles (bench/arm64/count_plugin.c) counts the instructions each executes. Counts do not depend on the
machine's load; they are not cycles (an emulator models no pipeline), but both sides are counted alike.

- dabuild: the library's units as native.py builds them, cross-compiled with gcc-aarch64-linux-gnu (the NEON
  path, -O3 for generic armv8-a: a native build adds -march=native), called through
  tests/arm64/kernel_driver.c (static) with the call dabuild prepares on the host; channels-last.
- onnxruntime: the user's libonnxruntime.so for arm64 Linux (the path is the one argument; e.g. npm's
  onnxruntime-node 1.20.1 ships bin/napi-v3/linux/arm64/libonnxruntime.so.1.20.1), loaded by
  bench/arm64/ort_driver.c with one thread, running a one-node ONNX model (NCHW, every graph optimisation).

Each side runs its layer once and three times in one process; (three - once) / 2 is one layer's
instructions, without the process start, reading the inputs, loading or preparing the session. Both get the
same input and weights, and their outputs are compared. Kernels: conv.c on ResNet-50's 3x3 and 1x1 convs
and MobileNetV2's depthwise conv at 56x56; pool.c on ResNet-50's max pool and an average pool; island_conv.c
(the integer reference's float island conv, in the C target's summation order, no fused multiply-adds)
against onnxruntime's Conv; qconv.c (the integer reference's int8 conv, which scores every tuning trial)
against onnxruntime's QLinearConv; histogram.c's calibration counts, which have no onnxruntime peer (its
calibration counts in numpy): dabuild's count alone, per value.

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
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "ir"))
from arm64_kernels import CROSS, EMULATOR, MISSING, Arm64Integer, Arm64Kernels, Layout, build_driver, prepare_float_conv

from dabuild.ir.kernels.integer import Requantization, prepare_conv
from dabuild.ir.kernels.island import prepare_island_conv
from dabuild.ir.kernels.native import TensorView, prepare_pool
from dabuild.ir.ops import OPS
from dabuild.qir.fixed_point import quantize_multiplier

HERE = Path(__file__).resolve().parent / "arm64"
CPU = "neoverse-n1"
SYSROOT = "/usr/aarch64-linux-gnu"  # Debian's arm64 libraries for the dynamically linked onnxruntime driver
HOST_COMPILER = "cc"
BINS = 2048  # histogram.c's bins per channel


@dataclass
class Case:
    """One kernel on one layer: dabuild's call (function, arguments, the arrays they point into, the result they
    fill), the input both sides get, onnxruntime's one-node model (None: no peer), how the work is counted."""

    name: str
    work: str
    function: str
    args: list[object]
    memory: list[np.ndarray]
    result: np.ndarray
    x: np.ndarray
    model: Any | None
    exact: bool = False  # outputs must agree bit for bit (else within float summation order)
    step: float | None = None  # an integer output's scale: outputs compared in steps of it


def model(op: str, x: np.ndarray, y_shape: tuple[int, ...], initializers: dict[str, np.ndarray], **attributes: Any) -> Any:
    """A one-node ONNX model of `op` from input "x" (and the initializers, in order) to output "y"."""
    from onnx import TensorProto, helper, numpy_helper

    node = helper.make_node(op, ["x", *initializers], ["y"], **attributes)
    graph = helper.make_graph([node], op, [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(y_shape))],
                              [numpy_helper.from_array(value, name) for name, value in initializers.items()])
    made = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    made.ir_version = 8
    return made


def conv_case(layout: Layout, rng: np.random.Generator, name: str, channels: int, out_channels: int, size: int,
              kernel: int, stride: int, pad: int, groups: int = 1, island: bool = False) -> Case:
    x = rng.standard_normal((1, channels, size, size)).astype(np.float32)
    weight = (rng.standard_normal((out_channels, channels // groups, kernel, kernel))
              / np.sqrt(channels // groups * kernel ** 2)).astype(np.float32)
    bias = rng.standard_normal(out_channels).astype(np.float32)
    strides, pads = [stride, stride], [pad] * 4
    if island:  # sums only: the island's bias and activation follow in numpy
        prepared = prepare_island_conv(x, weight, groups, strides, pads[:2], [1, 1], [(size + 2 * pad - kernel)
                                                                                      // stride + 1] * 2,
                                       layout.island_width)
        initializers = {"w": weight}
    else:
        prepared = prepare_float_conv(layout, x, weight, bias, strides, pads, [1, 1], groups, relu=False)
        initializers = {"w": weight, "b": bias}
    y = prepared.result
    macs = y.size * kernel ** 2 * channels // groups
    return Case(name, f"{macs / 1e6:.1f}M multiply-adds", prepared.kernel, [prepared.call, 0, prepared.rows],
                list(prepared.arrays), y, x, model("Conv", x, y.shape, initializers, kernel_shape=[kernel] * 2,
                                                   strides=strides, pads=pads, group=groups))


def pool_case(rng: np.random.Generator, name: str, op: str, channels: int, size: int, **attrs: Any) -> Case:
    x = rng.standard_normal((1, channels, size, size)).astype(np.float32)
    pool = OPS[op]
    resolved = pool.resolve(attrs)
    kernel, strides, pads, dilations = pool.geometry(resolved)
    y_shape = pool.run([x], attrs)[0].shape
    divisors = pool.divisors(x.shape, resolved) if op == "avg_pool" else None
    channels_last = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    prepared = prepare_pool(channels_last, kernel, strides, pads[:2], dilations, list(y_shape[2:]), divisors)
    onnx_op = {"max_pool": "MaxPool", "avg_pool": "AveragePool"}[op]
    extra = {"count_include_pad": 0} if op == "avg_pool" else {}
    return Case(name, f"{prepared.result.size * kernel[0] * kernel[1] / 1e6:.1f}M taps", prepared.kernel,
                [prepared.call, 0, prepared.rows], list(prepared.arrays), prepared.result.transpose(0, 3, 1, 2), x,
                model(onnx_op, x, y_shape, {}, kernel_shape=kernel, strides=strides, pads=pads, **extra),
                exact=op == "max_pool")  # an average's sum and division follow numpy's order, not onnxruntime's


def integer_conv_case(kernels: Arm64Kernels, rng: np.random.Generator, name: str, channels: int,
                      out_channels: int, size: int, kernel: int) -> Case:
    """qconv.c (the integer reference's 8-bit conv: int16 pairs, int32 sums, fixed-point requantization) against
    onnxruntime's QLinearConv, whose model takes and gives floats: QuantizeLinear, QLinearConv, DequantizeLinear
    (the two conversions are 0.4M elements of its count)."""
    x_scale, w_scale = 0.05, 0.01
    q = rng.integers(-128, 128, (1, channels, size, size)).astype(np.int8)
    x = (q.astype(np.float32) * np.float32(x_scale)).astype(np.float32)  # quantizes back to q exactly
    weight = rng.integers(-127, 128, (out_channels, channels, kernel, kernel)).astype(np.int8)
    bias = rng.integers(-20000, 20000, out_channels).astype(np.int32)
    y_scale = x_scale * w_scale * np.sqrt(channels * kernel ** 2) * 75 ** 2 / 40  # about 40 steps a typical sum
    multiplier, shift = quantize_multiplier(x_scale * w_scale / y_scale, name)
    packed = Arm64Integer(kernels).pack(weight, 2)  # the int16 pairs layout of the arm64 build's lanes
    wide = [np.ascontiguousarray(np.broadcast_to(v.astype(np.int64), out_channels)) for v in (bias, multiplier, shift)]
    pad = kernel // 2
    prepared = prepare_conv(np.ascontiguousarray(q.transpose(0, 2, 3, 1)), 0, packed,
                            Requantization(*wide, 0, -128, 127), [1, 1], [pad, pad], [1, 1], [size, size],
                            np.dtype(np.int8))
    from onnx import TensorProto, helper, numpy_helper

    scalars = {"x_scale": np.float32(x_scale), "zp": np.int8(0), "w_scale": np.float32(w_scale),
               "y_scale": np.float32(y_scale)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_scale", "zp"], ["xq"]),
             helper.make_node("QLinearConv", ["xq", "x_scale", "zp", "w", "w_scale", "zp", "y_scale", "zp", "b"],
                              ["yq"], kernel_shape=[kernel] * 2, pads=[pad] * 4),
             helper.make_node("DequantizeLinear", ["yq", "y_scale", "zp"], ["y"])]
    graph = helper.make_graph(
        nodes, "qconv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, out_channels, size, size])],
        [*(numpy_helper.from_array(np.array(value), key) for key, value in scalars.items()),
         numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")])
    made = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    made.ir_version = 8
    macs = size * size * out_channels * kernel ** 2 * channels
    return Case(name, f"{macs / 1e6:.1f}M multiply-adds", prepared.kernel, [prepared.call, 0, prepared.rows],
                list(prepared.arrays), prepared.result.transpose(0, 3, 1, 2), x, made, step=float(y_scale))


def histogram_case(rng: np.random.Generator, name: str, channels: int, size: int) -> Case:
    """histogram.c's counts of a ReLU output (channels last, as a conv leaves it) on grids set as calibration
    sets them (power-of-two widths whose windows hold the values)."""
    x = np.maximum(rng.standard_normal((1, size, size, channels)), 0).astype(np.float32)
    peaks = np.maximum(x.max(axis=(0, 1, 2)).astype(np.float64), 1e-3)
    width = 2.0 ** np.ceil(np.log2(peaks / (BINS // 2)))
    reciprocal = 1.0 / width  # float64, as histogram.c reads them
    offset = np.floor(x.min(axis=(0, 1, 2)) * reciprocal).astype(np.int64)
    whole_width = float(width.max() * 2)
    counts = np.zeros((channels, BINS), np.int32)
    whole = np.zeros(BINS, np.int64)
    view = TensorView(x.ctypes.data, size * size, channels, 1, channels, 1)
    return Case(name, f"{x.size / 1e6:.2f}M values", "channel_counts",
                [view, reciprocal, offset, counts, 1.0 / whole_width, 0, whole, 0, channels], [x], counts, x, None,
                exact=True)


def cases(kernels: Arm64Kernels) -> list[Case]:
    rng, layout = np.random.default_rng(0), kernels.layout
    return [conv_case(layout, rng, "conv.c: ResNet-50 3x3 conv 64->64 at 56x56", 64, 64, 56, 3, 1, 1),
            conv_case(layout, rng, "conv.c: ResNet-50 1x1 conv 64->256 at 56x56", 64, 256, 56, 1, 1, 0),
            conv_case(layout, rng, "conv.c: MobileNetV2 3x3 depthwise conv 144 at 56x56", 144, 144, 56, 3, 1, 1,
                      groups=144),
            pool_case(rng, "pool.c: ResNet-50 3x3/2 max pool 64 at 112x112", "max_pool", 64, 112, kernel=[3, 3],
                      strides=[2, 2], pads=[1, 1, 1, 1]),
            pool_case(rng, "pool.c: ShuffleNet v1's 3x3/2 average pool 240 at 28x28", "avg_pool", 240, 28, kernel=[3, 3],
                      strides=[2, 2], pads=[1, 1, 1, 1]),
            conv_case(layout, rng, "island_conv.c: 3x3 conv 64->64 at 56x56 (no FMA, fixed order)", 64, 64, 56, 3,
                      1, 1, island=True),
            integer_conv_case(kernels, rng, "qconv.c: int8 ResNet-50 3x3 conv 64->64 at 56x56", 64, 64, 56, 3),
            histogram_case(rng, "histogram.c: counts of a ReLU output 64 at 56x56", 64, 56)]


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


def dabuild_count(kernels: Arm64Kernels, plugin: Path, case: Case) -> int:
    """Instructions of one run of the case's kernel on arm64; its result is left in `case.result`."""
    request, arrays = kernels.request(case.function, case.args, case.memory)
    command = [*emulator(plugin), str(kernels.binary), "call", "times"]
    instructions, response, _ = per_run(command, len(command) - 1, request)
    kernels.unpack(case.function, response, arrays)
    return instructions


def onnxruntime_count(driver: Path, library: Path, plugin: Path, case: Case, folder: Path) -> tuple[int, np.ndarray,
                                                                                                    str]:
    """(instructions of one run, output, version) of onnxruntime's model of the case."""
    import onnx

    path = folder / "model.onnx"
    onnx.save(case.model, path)
    shape = [dim.dim_value for dim in case.model.graph.output[0].type.tensor_type.shape.dim]
    command = [*emulator(plugin), str(driver), str(library), str(path), "times", "x", "y",
               str(int(np.prod(shape))), *map(str, case.x.shape)]
    instructions, output, errors = per_run(command, command.index("times"), case.x.tobytes())
    version = next(line for line in errors.splitlines() if line.startswith("onnxruntime "))
    return instructions, np.frombuffer(output, np.float32).reshape(shape), version


def agreement(case: Case, reference: np.ndarray) -> str:
    if case.step is not None:
        steps = int(np.max(np.abs(case.result.astype(np.int64) - np.rint(reference / case.step).astype(np.int64))))
        return f"outputs differ by at most {steps} step{'s' if steps != 1 else ''} (rounding: fixed point vs float)"
    if case.exact:
        same = np.array_equal(case.result, reference, equal_nan=True)
        return "outputs equal bit for bit" if same else "OUTPUTS DIFFER"
    differ = float(np.max(np.abs(case.result - reference)) / (np.max(np.abs(reference)) or 1.0))
    return f"outputs differ by {differ:.1e} of their peak"


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
        version = subprocess.run([EMULATOR, "--version"], capture_output=True, text=True,
                                 check=True).stdout.partition("\n")[0]
        print(f"CPU: emulated aarch64, {version}, -cpu {CPU} (Arm Neoverse N1: NEON, 128-bit vectors); instructions "
              f"counted by a TCG plugin, 1 thread, batch 1; dabuild's {kernels.layout.path} path "
              f"({kernels.layout.vector_bytes}-byte vectors, {CROSS} -O3) against {args.onnxruntime}; ratio = "
              "dabuild's instructions / onnxruntime's (below 1: fewer)")
        for case in cases(kernels):
            ours = dabuild_count(kernels, plugin, case)
            if case.model is None:
                counted_all = int(case.result.sum()) == case.x.size
                print(f"{case.name} ({case.work}): dabuild {ours:,} instructions ({ours / case.x.size:.1f} a value), "
                      f"{'every value counted once' if counted_all else 'COUNTS MISS VALUES'}; no onnxruntime peer")
                continue
            theirs, reference, peer = onnxruntime_count(driver, args.onnxruntime, plugin, case, folder)
            print(f"{case.name} ({case.work}): dabuild {ours:,} instructions, {peer} {theirs:,}, ratio "
                  f"{ours / theirs:.2f}x; {agreement(case, reference)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
