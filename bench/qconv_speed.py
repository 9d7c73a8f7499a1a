"""The integer reference's conv (qconv.c) against onnxruntime's QLinearConv, layer by layer.

ResNet-50's conv shapes (and its 7x7 stem) at 56x56 .. 7x7, uint8 inputs, on one thread: dabuild's
`NativeInteger.conv` (the kernel a tuning trial runs for every 8-bit conv) with int8 weights (within +-127,
as dabuild quantizes them) and with 7-bit ones (within +-63, what the onnx target's tuning offers first where
onnxruntime's u8s8 kernels can saturate), each in the form `NativeInteger.form_for` picks for them, and a
one-node QLinearConv model (int8 weights) in onnxruntime's CPU provider, timed interleaved (`--rounds` times;
the fastest of each kept), by the process's CPU time, which other load on a shared machine inflates less than
wall time. Prints multiply-adds a second and the ratios of times (dabuild / onnxruntime: below 1 is faster),
and the totals over the layers. The requantization differs (dabuild's fixed point, onnxruntime's
float), so only the speed is compared here; tests/ir/test_integer_kernels.py proves qconv.c's bits.

Usage: python bench/qconv_speed.py [--batch 4] [--rounds 5]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from dabuild.ir.kernels.integer import NativeInteger, Requantization
from dabuild.ir.kernels.native import native_conv

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model_speed import cpu_name  # bench/, this script's folder

LAYERS = [  # input channels, output channels, kernel, stride, input size
    (3, 64, 7, 2, 224), (64, 64, 3, 1, 56), (64, 256, 1, 1, 56), (256, 64, 1, 1, 56), (128, 128, 3, 1, 28),
    (256, 256, 3, 1, 14), (1024, 256, 1, 1, 14), (512, 512, 3, 1, 7)]


def cpu_seconds(work: Callable[[], object]) -> float:
    start = time.process_time()
    work()
    return time.process_time() - start


def onnxruntime_conv(weight: np.ndarray, kernel: int, stride: int, shape: tuple[int, ...]) -> ort.InferenceSession:
    """A one-node QLinearConv model (uint8 x int8 -> uint8) on one thread."""
    pad = kernel // 2
    scalars = {"xs": np.float32(0.02), "xz": np.uint8(3), "ws": np.float32(0.01), "wz": np.int8(0),
               "ys": np.float32(0.5), "yz": np.uint8(0)}
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["y"],
                            kernel_shape=[kernel, kernel], pads=[pad] * 4, strides=[stride, stride])
    graph = helper.make_graph([node], "conv", [helper.make_tensor_value_info("x", TensorProto.UINT8, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
                              [numpy_helper.from_array(weight, "w"),
                               *(numpy_helper.from_array(np.array(value), name) for name, value in scalars.items())])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


WEIGHT_LIMITS = {8: 127, 7: 63}  # bits of the weights: their largest magnitude


def time_layer(integer: NativeInteger, layer: tuple[int, ...], batch: int, rounds: int,
               rng: np.random.Generator) -> tuple[list[float], list[str], int]:
    """The fastest CPU seconds of dabuild's conv of one layer with each of WEIGHT_LIMITS and of onnxruntime's
    (the last), the forms dabuild ran, and the layer's multiply-adds."""
    channels, out_channels, kernel, stride, size = layer
    pad, out = kernel // 2, (size + 2 * (kernel // 2) - kernel) // stride + 1
    x = rng.integers(0, 256, (batch, size, size, channels), dtype=np.uint8)
    requantization = Requantization(np.zeros(out_channels, np.int64), np.full(out_channels, 2**30, np.int64),
                                    np.full(out_channels, 40, np.int64), 0, 0, 255)
    runs, forms = [], []
    for limit in WEIGHT_LIMITS.values():
        weight = rng.integers(-limit, limit + 1, (out_channels, channels, kernel, kernel), dtype=np.int8)
        packed = integer.pack(weight, 2)  # its sums and magnitudes, for the form's choice
        form = integer.form_for(-limit, limit, packed.sums, packed.magnitudes, requantization.bias, 3,
                                np.dtype(np.uint8))
        assert form is not None, "sums of 8-bit values with no bias stay in int32"
        forms.append(form.name)
        runs.append(partial(integer.conv, form, x, 3, integer.pack(weight, form.group), requantization,
                            [stride, stride], [pad, pad], [1, 1], [out, out], np.dtype(np.uint8), 1))
    planar = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    runs.append(partial(onnxruntime_conv(weight, kernel, stride, planar.shape).run, None, {"x": planar}))
    for run in runs:
        run()  # warm: first touch, session setup
    best = [float("inf")] * len(runs)
    for _ in range(rounds):
        best = [min(seconds, cpu_seconds(run)) for seconds, run in zip(best, runs)]
    return best, forms, batch * out * out * out_channels * channels * kernel * kernel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    native = native_conv()
    if native is None or native.integer is None:
        raise SystemExit("no native kernels (no C compiler?): nothing to time")
    integer = native.integer
    print(f"cpu: {cpu_name()}; qconv.c: {native.path} path, {integer.lanes} int32 lanes, blocks of "
          f"{integer.block_vectors} vectors, forms {', '.join(form.name for form in integer.forms)}; "
          f"onnxruntime {ort.__version__}; 1 thread, batch {args.batch}, CPU time, fastest of {args.rounds}")
    rng = np.random.default_rng(0)
    totals = [0.0] * (len(WEIGHT_LIMITS) + 1)
    for layer in LAYERS:
        seconds, forms, macs = time_layer(integer, layer, args.batch, args.rounds, rng)
        totals = [total + value for total, value in zip(totals, seconds)]
        channels, out_channels, kernel, stride, size = layer
        dabuild = ", ".join(f"int{bits} {value * 1e3:6.2f} ms ({macs / value / 1e9:5.1f} G/s, ratio "
                            f"{value / seconds[-1]:.2f})" for bits, value in zip(WEIGHT_LIMITS, seconds))
        print(f"  {channels:>4} -> {out_channels:<4} {kernel}x{kernel}/{stride} at {size:>3}: onnxruntime "
              f"{seconds[-1] * 1e3:6.2f} ms ({macs / seconds[-1] / 1e9:5.1f} G multiply-adds/s); dabuild {dabuild}",
              flush=True)
    print("forms: " + ", ".join(f"int{bits} weights {form}" for bits, form in zip(WEIGHT_LIMITS, forms)))
    print(f"all layers: onnxruntime {totals[-1] * 1e3:.1f} ms; dabuild " + ", ".join(
        f"int{bits} weights {total * 1e3:.1f} ms, ratio {total / totals[-1]:.2f}" for bits, total in zip(WEIGHT_LIMITS, totals)))


if __name__ == "__main__":
    main()
