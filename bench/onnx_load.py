"""ONNX load benchmark: trace a ~25-million-parameter ResNet-50 .onnx end to end, in time and memory.

Builds ResNet-50 (bottleneck blocks 3-4-6-3, conv + batch norm + relu, random
weights, dynamic batch) with onnx.helper into a temporary .onnx file, then, in a
fresh process so that peak RSS counts only dabuild's work, runs what the trace
stage does: read and convert the file (trace_model), run the passes (optimize),
save the graph (graph.json + weights.npz) and load it back. Prints seconds and
peak GB against the targets (< 60 s, < 3 GB).

Usage: python bench/onnx_load.py [--verify]   (--verify also compares one image with onnxruntime)
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

TARGET_SECONDS = 60.0
TARGET_GB = 3.0
STAGES = ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))  # (width, blocks, first stride): ResNet-50


class ResNetBuilder:
    """Nodes and initializers of a ResNet-50 in NCHW, named like torchvision's."""

    def __init__(self, seed: int = 0):
        from onnx import helper, numpy_helper

        self.helper, self.numpy_helper = helper, numpy_helper
        self.rng = np.random.default_rng(seed)
        self.nodes: list = []
        self.initializers: list = []
        self.parameters = 0

    def _tensor(self, name: str, array: np.ndarray) -> str:
        self.initializers.append(self.numpy_helper.from_array(array.astype(np.float32), name))
        self.parameters += array.size
        return name

    def conv_bn(self, x: str, name: str, c_in: int, c_out: int, kernel: int, stride: int, relu: bool) -> str:
        fan_in = c_in * kernel * kernel
        weight = self._tensor(f"{name}.weight", self.rng.normal(0, (2 / fan_in) ** 0.5, (c_out, c_in, kernel, kernel)))
        pad = kernel // 2
        self.nodes.append(
            self.helper.make_node(
                "Conv", [x, weight], [f"{name}.conv"], name=f"{name}.conv",
                kernel_shape=[kernel, kernel], strides=[stride, stride], pads=[pad] * 4,
            )
        )
        bn = [
            self._tensor(f"{name}.bn.{part}", values)
            for part, values in (
                ("scale", self.rng.uniform(0.5, 1.0, c_out)),
                ("bias", self.rng.normal(0, 0.1, c_out)),
                ("mean", self.rng.normal(0, 0.1, c_out)),
                ("var", self.rng.uniform(0.5, 1.5, c_out)),
            )
        ]
        self.nodes.append(
            self.helper.make_node("BatchNormalization", [f"{name}.conv", *bn], [f"{name}.bn"], name=f"{name}.bn")
        )
        if not relu:
            return f"{name}.bn"
        self.nodes.append(self.helper.make_node("Relu", [f"{name}.bn"], [f"{name}.relu"], name=f"{name}.relu"))
        return f"{name}.relu"

    def bottleneck(self, x: str, name: str, c_in: int, width: int, stride: int) -> str:
        h = self.conv_bn(x, f"{name}.1", c_in, width, 1, 1, relu=True)
        h = self.conv_bn(h, f"{name}.2", width, width, 3, stride, relu=True)
        h = self.conv_bn(h, f"{name}.3", width, width * 4, 1, 1, relu=False)
        skip = x if stride == 1 and c_in == width * 4 else self.conv_bn(x, f"{name}.down", c_in, width * 4, 1, stride, False)
        self.nodes.append(self.helper.make_node("Add", [h, skip], [f"{name}.add"], name=f"{name}.add"))
        self.nodes.append(self.helper.make_node("Relu", [f"{name}.add"], [f"{name}.out"], name=f"{name}.out"))
        return f"{name}.out"

    def model(self, classes: int = 1000):
        import onnx

        h = self.conv_bn("x", "stem", 3, 64, 7, 2, relu=True)
        self.nodes.append(
            self.helper.make_node("MaxPool", [h], ["stem.pool"], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4)
        )
        h, channels = "stem.pool", 64
        for stage, (width, blocks, stride) in enumerate(STAGES, start=1):
            for block in range(blocks):
                h = self.bottleneck(h, f"layer{stage}.{block}", channels, width, stride if block == 0 else 1)
                channels = width * 4
        self.nodes.append(self.helper.make_node("GlobalAveragePool", [h], ["pool"]))
        self.nodes.append(self.helper.make_node("Flatten", ["pool"], ["flat"]))
        fc_w = self._tensor("fc.weight", self.rng.normal(0, channels**-0.5, (classes, channels)))
        fc_b = self._tensor("fc.bias", np.zeros(classes))
        self.nodes.append(self.helper.make_node("Gemm", ["flat", fc_w, fc_b], ["logits"], transB=1))
        float_type = onnx.TensorProto.FLOAT
        graph = self.helper.make_graph(
            self.nodes,
            "resnet50",
            [self.helper.make_tensor_value_info("x", float_type, ["N", 3, 224, 224])],
            [self.helper.make_tensor_value_info("logits", float_type, ["N", classes])],
            self.initializers,
        )
        opsets = [self.helper.make_operatorsetid("", 17)]
        return self.helper.make_model(graph, opset_imports=opsets, ir_version=8)


def child(model_path: Path, out_dir: Path) -> None:
    """What the trace stage does with an .onnx source, timed; run in its own process."""
    from dabuild.ir import Graph
    from dabuild.ir.passes import optimize
    from dabuild.trace import trace_model

    start = time.perf_counter()
    graph = optimize(trace_model(model_path))
    graph.save(out_dir)
    loaded = Graph.load(out_dir)
    elapsed = time.perf_counter() - start
    parameters = sum(array.size for array in loaded.constants.values())
    print(f"{elapsed:.3f} {parameters} {len(loaded.nodes)}")


def verify(model_path: Path, out_dir: Path) -> float:
    """Largest difference between dabuild's interpreter and onnxruntime on one random image."""
    import onnxruntime as ort

    from dabuild.ir import Graph
    from dabuild.ir.interpreter import run

    x = np.random.default_rng(1).normal(size=(1, 3, 224, 224)).astype(np.float32)
    want = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    graph = Graph.load(out_dir)
    got = run(graph, {"x": x})[graph.outputs[0]]
    return float(np.abs(got - want).max() / max(1e-12, np.abs(want).max()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verify", action="store_true", help="compare one image with onnxruntime")
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(Path(args.child[0]), Path(args.child[1]))
        return
    import onnx

    with tempfile.TemporaryDirectory(prefix="dabuild-onnx-bench-") as work:
        model_path, out_dir = Path(work) / "resnet50.onnx", Path(work) / "graph"
        builder = ResNetBuilder()
        onnx.save(builder.model(), model_path)
        size_mb = model_path.stat().st_size / 1e6
        print(f"ResNet-50 .onnx: {builder.parameters / 1e6:.1f} M parameters, {size_mb:.0f} MB, {len(builder.nodes)} nodes")
        del builder
        result = subprocess.run(
            [sys.executable, __file__, "--child", str(model_path), str(out_dir)],
            check=True, capture_output=True, text=True,
        )
        seconds_text, parameters, nodes = result.stdout.split()
        seconds = float(seconds_text)
        peak_gb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024 / 1e9  # Linux reports KiB
        print(f"traced + optimised + saved + loaded: {int(nodes)} IR nodes, {int(parameters) / 1e6:.1f} M constants")
        print(f"time     {seconds:7.2f} s   target < {TARGET_SECONDS:.0f} s   ({seconds / TARGET_SECONDS:.2f} of budget)")
        print(f"peak RSS {peak_gb:7.2f} GB  target < {TARGET_GB:.0f} GB    ({peak_gb / TARGET_GB:.2f} of budget)")
        if args.verify:
            print(f"max |dabuild - onnxruntime| / max |onnxruntime| on one image: {verify(model_path, out_dir):.2e}")


if __name__ == "__main__":
    main()
