"""One trial of a tuning run against onnxruntime's int8 QDQ run of the same images, config by config.

Reads a build that bench/big_model.py left (`--work DIR`: DIR/build/resnet holds the trace, the calibration
statistics and the onnx target's QDQ model) and scores, with the tune stage's Evaluator, the configs whose
cost differs: the default (all int8), op-type-wise moves (every conv's weights per channel; every conv's weights
7-bit, as the onnx target's tuning offers them first where onnxruntime's u8s8 kernels saturate) and op-wise
fp32 fallbacks of a conv (a float island: the slowest trials of a basic run) and of the dense layer. Each
trial runs twice and the second run is timed (the first fills the weight cache the way a tuning run's
earlier trials do). Prints each trial's seconds, onnxruntime's over the same images, and their ratio
(the big_model goal: <= 2), then where the default and the int7 trials' CPU time goes by layer type.

Usage: python bench/trial_speed.py DIR [--evaluation 64]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from dabuild.capability import load_capability
from dabuild.ir.kernels.native import layer_threads
from dabuild.qir.reference import absorbed_clamps, quantize_input
from dabuild.quant.config import QuantConfig
from dabuild.tune.evaluate import EvalSetup, Evaluator
from dabuild.tune.space import FP32, build_space

sys.path.insert(0, str(Path(__file__).resolve().parent))
from big_model import qdq_seconds  # onnxruntime timed as big_model.py times it

CAPABILITY = Path(__file__).resolve().parents[1] / "capabilities" / "c.yaml"


def configs(evaluator: Evaluator) -> dict[str, QuantConfig]:
    space = build_space(evaluator.graph, load_capability(CAPABILITY))
    base = space.default()
    convs = [node.name for node in evaluator.graph.nodes if node.op == "conv"]
    dense = next(node.name for node in evaluator.graph.nodes if node.op == "dense")
    def convs_with(**choice: str) -> QuantConfig:
        return QuantConfig({name: dataclasses.replace(node, weight=dataclasses.replace(node.weight, **choice))
                            if name in convs and node.weight else node for name, node in base.nodes.items()})

    return {"default (int8)": base, "convs per channel": convs_with(granularity="per_channel"),
            "convs' weights int7": convs_with(dtype="int7"),
            f"fp32 {convs[0]}": space.with_node(base, convs[0], FP32),
            f"fp32 {convs[len(convs) // 2]}": space.with_node(base, convs[len(convs) // 2], FP32),
            f"fp32 {dense}": space.with_node(base, dense, FP32)}


def layer_seconds(evaluator: Evaluator, config: QuantConfig) -> dict[str, float]:
    """CPU seconds (every thread's: steadier than wall time on a shared machine) per layer type of one batch
    of the config's integer run, as run_integer runs it, and of lowering the config."""
    start = time.process_time()
    qgraph = evaluator.quantize(config)
    seconds: dict[str, float] = defaultdict(float)
    seconds["lowering"] = time.process_time() - start
    x = evaluator.setup.x[:evaluator.batch_size]
    fused = absorbed_clamps(qgraph)
    values = {**qgraph.constants, qgraph.input: quantize_input(qgraph, x)}
    with layer_threads(evaluator.threads):
        for index, layer in enumerate(qgraph.layers):
            if index - 1 in fused:
                continue
            inputs = [values[name] for name in layer.inputs]
            start = time.process_time()
            if index in fused:
                outputs, names, op = layer.run_clamped(inputs, qgraph, fused[index]), fused[index].outputs, "add+relu"
            else:
                outputs, names, op = layer.run(inputs, qgraph, None), layer.outputs, layer.op
            seconds[op] += time.process_time() - start
            values.update(zip(names, outputs))
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", type=Path, help="bench/big_model.py's --work folder")
    parser.add_argument("--evaluation", type=int, default=64, help="images (the build's, repeated as needed)")
    args = parser.parse_args()
    os.environ.setdefault("DABUILD_MEMORY", "2G")
    build = args.work / "build" / "resnet"
    with np.load(args.work / "data.npz") as data:
        images = data["x_eval"]
    images = np.concatenate([images] * -(-args.evaluation // len(images)))[:args.evaluation]
    evaluator = Evaluator(EvalSetup(build / "trace", build / "calibrate", images,
                                    np.zeros(len(images), np.int64), "accuracy", 64))
    print(f"ResNet-50, {len(images)} evaluation images, batch {evaluator.batch_size}, {evaluator.threads} threads, "
          f"{os.cpu_count()} cores", flush=True)
    for name, config in configs(evaluator).items():
        evaluator.score(config)
        start = time.perf_counter()
        evaluator.score(config)
        trial = time.perf_counter() - start
        qdq = qdq_seconds(build / "export-ort" / "model.onnx", images)
        print(f"  {name:<44} trial {trial:6.2f} s / onnxruntime int8 QDQ {qdq:6.2f} s = {trial / qdq:5.2f}",
              flush=True)
    for name in ("default (int8)", "convs' weights int7"):
        seconds = layer_seconds(evaluator, configs(evaluator)[name])
        total = sum(seconds.values())
        images = min(evaluator.batch_size, len(evaluator.setup.x))
        print(f"{name} trial by layer type (CPU time, {images} images):")
        for op, value in sorted(seconds.items(), key=lambda item: -item[1]):
            print(f"  {op:<10} {1000 * value / images:7.2f} ms per image  {100 * value / total:5.1f} %")

if __name__ == "__main__":
    sys.exit(main())
