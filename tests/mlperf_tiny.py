"""MLPerf Tiny's five reference models as dabuild graphs; shared by tests/mcu/test_mlperf_tiny.py and bench/tiny.py.

Written here from the reference architectures of mlcommons/tiny (benchmark/training/*: keyword_spotting's
DS-CNN, visual_wake_words' MobileNetV1 alpha 0.25, image_classification's ResNet-8, anomaly_detection's FC
autoencoder, streaming_wakeword's DS-TCN), with TensorFlow's 'same' padding spelled as explicit pads (the
extra row and column of a stride-2 layer at the bottom and right, as TensorFlow pads them). The weights are
random (He-scaled, seeded); each batch norm gets the statistics its layer really produces on the calibration
data (so, as in a trained network, it standardises its input) and random scale and shift, which gives the
activation ranges a trained network has without shipping trained weights. Quantized as the c capability
chooses by default: int8 activations, int8 per-channel weights.

  kws       DS-CNN, 49x10x1 MFCC (NHWC) -> 12 classes: 10x4 stride-2 stem, four depthwise-separable blocks.
  vww       MobileNetV1 0.25, 96x96x3 (NHWC) -> 2 classes: thirteen depthwise-separable blocks.
  ic        ResNet-8, 32x32x3 (NHWC) -> 10 classes: three residual stacks (16, 32, 64 channels).
  ad        FC autoencoder, 640 -> 128 x4 -> 8 -> 128 x4 -> 640.
  wakeword  streaming wake-word DS-TCN (v1.3), 40 features x 30 frames of 32 ms -> 3 classes: four 1-D
            depthwise-separable blocks (kernels 3, 5, 10, 15, valid padding).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dabuild.capability import load_capability
from dabuild.ir import Graph, Node, TensorSpec
from dabuild.ir.interpreter import Interpreter
from dabuild.ir.passes import optimize
from dabuild.progress import Progress
from dabuild.qir.qgraph import QGraph
from dabuild.quant.calibrate import calibrate
from dabuild.quant.defaults import default_config
from dabuild.quant.quantize import quantize
from dabuild.resources import data_dir

CALIBRATION_SAMPLES = 32


class Builder:
    """Appends layers with seeded random weights; batch norms take the statistics of the data they see.

    An image model's input is NHWC, as TFLite's converter gives it (`channels_last`): the graph transposes it to
    the IR's NCHW first, which the c target takes as a view of the input's bytes (no copy)."""

    def __init__(self, shape: tuple[int, ...], seed: int = 0, channels_last: bool = False):
        self.rng = np.random.default_rng(seed)
        stored = (*shape[1:], shape[0]) if channels_last else shape
        self.graph = Graph([TensorSpec("x", (None, *stored))], [], [], {})
        self.data = self.rng.standard_normal((CALIBRATION_SAMPLES, *stored)).astype(np.float32)
        self.input = self.node("transpose", ["x"], perm=[0, len(shape), *range(1, len(shape))]) if channels_last else "x"

    def const(self, array: np.ndarray) -> str:
        name = f"c{len(self.graph.constants)}"
        self.graph.constants[name] = np.asarray(array, np.float32)
        return name

    def node(self, op: str, inputs: list[str], **attrs: object) -> str:
        name = f"{op}{len(self.graph.nodes)}"
        self.graph.nodes.append(Node(name, op, inputs, [name], dict(attrs)))
        return name

    def values(self, tensor: str) -> np.ndarray:
        """What `tensor` holds on the calibration data (the graph so far, run by the interpreter)."""
        graph = Graph(self.graph.inputs, [tensor], list(self.graph.nodes), dict(self.graph.constants))
        return Interpreter(graph).run({"x": self.data})[tensor]

    def batch_norm(self, x: str, relu: bool = True) -> str:
        observed = self.values(x)
        axes = tuple(a for a in range(observed.ndim) if a != 1)
        channels = observed.shape[1]
        params = [self.rng.uniform(0.5, 1.5, channels), self.rng.normal(0.1, 0.2, channels),
                  observed.mean(axes), observed.var(axes) + 1e-3]
        y = self.node("batch_norm", [x, *(self.const(p) for p in params)])
        return self.node("relu", [y]) if relu else y

    def conv(self, x: str, channels_in: int, channels_out: int, kernel: tuple[int, ...], strides: tuple[int, ...],
             pads: tuple[int, ...], groups: int = 1, bias: bool = True) -> str:
        fan_in = channels_in // groups * int(np.prod(kernel))
        weight = self.rng.standard_normal((channels_out, channels_in // groups, *kernel)) * np.sqrt(2 / fan_in)
        inputs = [x, self.const(weight)] + ([self.const(self.rng.normal(0, 0.05, channels_out))] if bias else [])
        return self.node("conv", inputs, strides=list(strides), pads=list(pads), groups=groups)

    def dense(self, x: str, features_in: int, features_out: int) -> str:
        weight = self.rng.standard_normal((features_in, features_out)) * np.sqrt(2 / features_in)
        return self.node("dense", [x, self.const(weight), self.const(self.rng.normal(0, 0.05, features_out))])

    def finish(self, output: str) -> Graph:
        self.graph.outputs = [output]
        return optimize(self.graph)


def same_pads(size: int, kernel: int, stride: int) -> tuple[int, int]:
    """TensorFlow's 'same' padding of one axis: (before, after), the odd one after."""
    out = -(-size // stride)
    total = max((out - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


def pads_2d(height: int, width: int, kernel: tuple[int, int], stride: int) -> tuple[int, int, int, int]:
    (top, bottom), (left, right) = same_pads(height, kernel[0], stride), same_pads(width, kernel[1], stride)
    return top, left, bottom, right


def kws() -> Graph:
    b = Builder((1, 49, 10), channels_last=True)
    x = b.batch_norm(b.conv(b.input, 1, 64, (10, 4), (2, 2), pads_2d(49, 10, (10, 4), 2)))
    for _ in range(4):
        x = b.batch_norm(b.conv(x, 64, 64, (3, 3), (1, 1), (1, 1, 1, 1), groups=64))
        x = b.batch_norm(b.conv(x, 64, 64, (1, 1), (1, 1), (0, 0, 0, 0)))
    x = b.node("flatten", [b.node("avg_pool", [x], kernel=[25, 5])])
    return b.finish(b.node("softmax", [b.dense(x, 64, 12)]))


VWW_BLOCKS = ((16, 1), (32, 2), (32, 1), (64, 2), (64, 1), (128, 2), (128, 1), (128, 1), (128, 1), (128, 1),
              (128, 1), (256, 2), (256, 1))   # (pointwise filters, depthwise stride) of MobileNetV1 0.25


def vww() -> Graph:
    b = Builder((3, 96, 96), channels_last=True)
    x = b.batch_norm(b.conv(b.input, 3, 8, (3, 3), (2, 2), pads_2d(96, 96, (3, 3), 2)))
    channels, size = 8, 48
    for filters, stride in VWW_BLOCKS:
        x = b.batch_norm(b.conv(x, channels, channels, (3, 3), (stride, stride), pads_2d(size, size, (3, 3), stride),
                                groups=channels))
        size = -(-size // stride)
        x = b.batch_norm(b.conv(x, channels, filters, (1, 1), (1, 1), (0, 0, 0, 0)))
        channels = filters
    x = b.node("flatten", [b.node("avg_pool", [x], kernel=[size, size])])
    return b.finish(b.node("softmax", [b.dense(x, channels, 2)]))


def ic() -> Graph:
    b = Builder((3, 32, 32), channels_last=True)
    x = b.batch_norm(b.conv(b.input, 3, 16, (3, 3), (1, 1), (1, 1, 1, 1)))
    channels, size = 16, 32
    for filters in (16, 32, 64):
        stride = 1 if filters == channels else 2
        y = b.batch_norm(b.conv(x, channels, filters, (3, 3), (stride, stride), pads_2d(size, size, (3, 3), stride)))
        y = b.batch_norm(b.conv(y, filters, filters, (3, 3), (1, 1), (1, 1, 1, 1)), relu=False)
        shortcut = x if stride == 1 else b.conv(x, channels, filters, (1, 1), (2, 2), (0, 0, 0, 0))
        x = b.node("relu", [b.node("add", [y, shortcut])])
        channels, size = filters, size // stride
    x = b.node("flatten", [b.node("avg_pool", [x], kernel=[size, size])])
    return b.finish(b.node("softmax", [b.dense(x, channels, 10)]))


def ad() -> Graph:
    b = Builder((640,))
    x, width = "x", 640
    for features in (128, 128, 128, 128, 8, 128, 128, 128, 128):
        x, width = b.batch_norm(b.dense(x, width, features)), features
    return b.finish(b.dense(x, width, 640))


WAKEWORD_BLOCKS = ((128, 3), (64, 5), (64, 10), (32, 15))   # (pointwise filters, depthwise kernel), valid padding
WAKEWORD_FEATURES, WAKEWORD_FRAMES = 40, 30


def wakeword() -> Graph:
    b = Builder((WAKEWORD_FEATURES, WAKEWORD_FRAMES))
    x, channels = "x", WAKEWORD_FEATURES
    for filters, kernel in WAKEWORD_BLOCKS:
        x = b.conv(x, channels, channels, (kernel,), (1,), (0, 0), groups=channels, bias=False)
        x = b.batch_norm(b.conv(x, channels, filters, (1,), (1,), (0, 0), bias=False))
        channels = filters
    return b.finish(b.dense(b.node("flatten", [x]), channels * (WAKEWORD_FRAMES - 29), 3))


MODELS: dict[str, Callable[[], Graph]] = {"kws": kws, "vww": vww, "ic": ic, "ad": ad, "wakeword": wakeword}


def quantized(name: str) -> tuple[QGraph, np.ndarray]:
    """The model int8-quantized with the c capability's defaults, calibrated on its own random data; and that
    data (float32, for a few samples to check)."""
    return quantized_graph(MODELS[name]())


def quantized_graph(graph: Graph) -> tuple[QGraph, np.ndarray]:
    """`quantized` for any graph of one input `x` (a Builder's)."""
    shape = tuple(graph.inputs[0].shape[1:])
    data = np.random.default_rng(7).standard_normal((CALIBRATION_SAMPLES, *shape)).astype(np.float32)
    stats = calibrate(graph, ({"x": data[i:i + 16]} for i in range(0, len(data), 16)), Progress.silent())
    return quantize(graph, stats, default_config(graph, load_capability(data_dir("capabilities") / "c.yaml"))), data
