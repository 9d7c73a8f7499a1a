"""Interpreter throughput: dabuild's numpy interpreter against onnxruntime on the same float graphs.

Two graphs: a ResNet-style CNN (batch 64, 3x32x32, residual blocks of
conv + batch_norm + relu, global average pool, dense) built here with random
weights, and the digits MLP traced from recipes/digits. Each is optimised by
dabuild (batch norm folded, activations fused), exported with
dabuild.targets.onnx_float and run by onnxruntime's CPUExecutionProvider with
the same intra-op thread count as dabuild's: the Interpreter's `threads` (batch
slices of a conv net on that many threads) under a BLAS limited to that many
threads. Each side prepares the graph
once (an Interpreter, an InferenceSession) outside the timed calls. Prints images/s for both and
dabuild/onnxruntime (target: >= 0.5), each from the fastest call in the timed window,
and which conv implementation the interpreter ran (compiled kernels or numpy).

Usage: python bench/interpreter.py [--threads 1 2] [--seconds 3]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
from threadpoolctl import threadpool_limits
from timing import fastest

from dabuild.ir import Graph, Node, TensorSpec
from dabuild.ir.interpreter import Interpreter
from dabuild.ir.kernels.native import native_backend
from dabuild.ir.passes import optimize
from dabuild.targets.onnx_float import to_onnx
from dabuild.trace import load_model, trace_model

DIGITS = Path(__file__).resolve().parent.parent / "recipes" / "digits"


class CnnBuilder:
    """Appends conv/batch_norm/relu layers with random (He-scaled) weights to a graph."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.graph = Graph([TensorSpec("image", (None, 3, 32, 32))], [], [], {})

    def const(self, name: str, array: np.ndarray) -> str:
        self.graph.constants[name] = array.astype(np.float32)
        return name

    def node(self, op: str, inputs: list[str], **attrs: object) -> str:
        name = f"{op}{len(self.graph.nodes)}"
        self.graph.nodes.append(Node(name, op, inputs, [name], dict(attrs)))
        return name

    def conv_bn(self, x: str, channels_in: int, channels_out: int, kernel: int, stride: int, relu: bool) -> str:
        index = len(self.graph.nodes)
        fan_in = channels_in * kernel * kernel
        weight = self.const(f"w{index}", self.rng.standard_normal((channels_out, channels_in, kernel, kernel))
                            * np.sqrt(2 / fan_in))
        pad = kernel // 2
        y = self.node("conv", [x, weight], strides=[stride, stride], pads=[pad] * 4)
        params = [self.rng.uniform(0.5, 1.5, channels_out), self.rng.normal(0, 0.1, channels_out),
                  self.rng.normal(0, 0.1, channels_out), self.rng.uniform(0.5, 1.5, channels_out)]
        names = [self.const(f"bn{index}_{i}", p) for i, p in enumerate(params)]
        y = self.node("batch_norm", [y, *names])
        return self.node("relu", [y]) if relu else y

    def block(self, x: str, channels_in: int, channels_out: int, stride: int) -> str:
        """A basic residual block; a strided 1x1 conv projects the shortcut when the shape changes."""
        y = self.conv_bn(x, channels_in, channels_out, 3, stride, relu=True)
        y = self.conv_bn(y, channels_out, channels_out, 3, 1, relu=False)
        shortcut = x if stride == 1 and channels_in == channels_out else self.conv_bn(
            x, channels_in, channels_out, 1, stride, relu=False)
        return self.node("relu", [self.node("add", [y, shortcut])])


def resnet_graph(blocks_per_stage: int = 2) -> Graph:
    """ResNet-14-style CNN for 32x32 images: stem, three stages (16, 32, 64 channels), pool, dense."""
    b = CnnBuilder()
    x = b.conv_bn("image", 3, 16, 3, 1, relu=True)
    channels = 16
    for stage, width in enumerate((16, 32, 64)):
        for index in range(blocks_per_stage):
            x = b.block(x, channels, width, 2 if stage and not index else 1)
            channels = width
    x = b.node("flatten", [b.node("global_avg_pool", [x])])
    weight = b.const("fc_w", b.rng.standard_normal((channels, 10)) / np.sqrt(channels))
    b.graph.outputs = [b.node("dense", [x, weight, b.const("fc_b", np.zeros(10))])]
    return optimize(b.graph)


def digits_graph() -> Graph:
    forward = load_model(f"{DIGITS / 'model.py'}:build", DIGITS / "weights.npz")
    return optimize(trace_model(forward, inputs={"x": (1, 64)}))


def throughput(call: Callable[[], object], batch: int, seconds: float) -> float:
    """Images per second of the fastest call within `seconds`."""
    return batch / fastest(call, seconds)


def compare(name: str, graph: Graph, x: np.ndarray, threads: int, seconds: float) -> float:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(to_onnx(graph).SerializeToString(), options, providers=["CPUExecutionProvider"])
    interpreter = Interpreter(graph, threads=threads)  # prepared once, as the onnxruntime session is
    feeds = {graph.inputs[0].name: x}
    ours_out = interpreter.run(feeds)[graph.outputs[0]]
    theirs_out = session.run(None, feeds)[0]
    difference = float(np.max(np.abs(ours_out - theirs_out)))
    ours = theirs = 0.0
    for _ in range(2):  # interleaved rounds, so a burst of load elsewhere does not favour one side
        with threadpool_limits(limits=threads):
            ours = max(ours, throughput(lambda: interpreter.run(feeds), len(x), seconds / 2))
        theirs = max(theirs, throughput(lambda: session.run(None, feeds), len(x), seconds / 2))
    print(f"{name:<28} threads={threads}  dabuild {ours:10.0f} img/s  onnxruntime {theirs:10.0f} img/s  "
          f"ratio {ours / theirs:5.2f}  (max |diff| {difference:.1e})")
    return ours / theirs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--seconds", type=float, default=3.0, help="timed seconds per measurement")
    args = parser.parse_args()
    rng = np.random.default_rng(1)
    resnet, digits = resnet_graph(), digits_graph()
    print(f"resnet: {resnet.summary()}")
    print(f"digits: {digits.summary()}")
    print(f"convs: {native_backend()}  (DABUILD_NATIVE_KERNELS=0 runs them in numpy)")
    images = rng.standard_normal((64, 3, 32, 32)).astype(np.float32)
    samples = rng.uniform(0, 16, (64, 64)).astype(np.float32)
    for threads in args.threads:
        compare("resnet-style CNN, batch 64", resnet, images, threads, args.seconds)
        compare("digits MLP, batch 64", digits, samples, threads, args.seconds)
        compare("digits MLP, batch 1", digits, samples[:1], threads, args.seconds)


if __name__ == "__main__":
    main()
