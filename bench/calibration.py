"""Calibration benchmark: memory flatness as the calibration set grows 10x, and int8 accuracy vs onnxruntime.

(a) Calibrates the digits MLP and a small digits CNN on N and 10N samples made
    on the fly from the digits images plus noise (no sample outlives its batch),
    each run in a fresh process, and prints the tracemalloc peak of the
    calibration pass, the process's max RSS, the size of stats.npz, and the
    10N / N ratios (target: within 0.8..1.2).
(b) Quantizes the digits MLP to int8 with each calibration algorithm the C
    capability offers (accuracy measured through dabuild's bit-exact integer
    reference, what the C target runs), and the same model, built as ONNX from
    the same weights, with onnxruntime's quantize_static (QDQ, per-tensor,
    int8, MinMax / Entropy / Percentile), on the same calibration and
    evaluation data; prints every accuracy, each side's best and their ratio.
    Then the same comparison on the trained digits CNN (recipes/digits-cnn):
    onnxruntime quantizes its model.onnx, and dabuild traces that same file
    through its ONNX frontend; dabuild's int8 accuracy per activation
    calibration algorithm with per-tensor and per-channel weights, and the
    config its `basic` strategy chooses with the C capability (the real tune
    stage, the recipe's goal); onnxruntime per-tensor and per-channel weights,
    each with MinMax / Entropy / Percentile.

Usage: python bench/calibration.py
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import logging
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from ort_peer import calibration_reader, ort_accuracy  # noqa: E402

DIGITS = REPO / "recipes" / "digits"
DIGITS_CNN = REPO / "recipes" / "digits-cnn"
BATCH = 64                # the recipe's default batch size
CALIBRATION_SAMPLES = 512  # recipes/digits/recipe.yaml calibrates on the first 512 training rows


def digits_data() -> dict[str, np.ndarray]:
    with np.load(DIGITS / "data.npz") as data:
        return {key: data[key] for key in data.files}


def mlp_graph():
    from dabuild.ir.passes import optimize
    from dabuild.trace.base import load_model, trace_model

    model = load_model(f"{DIGITS / 'model.py'}:build", DIGITS / "weights.npz")
    return optimize(trace_model(model, "numpy", {"x": (None, 64)}))


def cnn_graph():
    """1x8x8 -> conv 8 (3x3) relu -> conv 16 (3x3) relu -> max pool 2 -> dense 10; random weights
    (memory does not depend on what the weights learnt)."""
    from dabuild.ir import Graph, Node, TensorSpec

    rng = np.random.default_rng(0)

    def he(fan_in: int, *shape: int) -> np.ndarray:
        return rng.normal(0, np.sqrt(2 / fan_in), shape).astype(np.float32)

    constants = {"k1": he(9, 8, 1, 3, 3), "c1": np.zeros(8, np.float32), "k2": he(72, 16, 8, 3, 3),
                 "c2": np.zeros(16, np.float32), "w": he(256, 256, 10), "b": np.zeros(10, np.float32)}
    nodes = [
        Node("conv1", "conv", ["x", "k1", "c1"], ["a1"], {"pads": [1, 1, 1, 1], "activation": "relu"}),
        Node("conv2", "conv", ["a1", "k2", "c2"], ["a2"], {"pads": [1, 1, 1, 1], "activation": "relu"}),
        Node("pool", "max_pool", ["a2"], ["p"], {"kernel": [2, 2], "strides": [2, 2]}),
        Node("flat", "flatten", ["p"], ["f"], {}),
        Node("fc", "dense", ["f", "w", "b"], ["y"], {}),
    ]
    return Graph([TensorSpec("x", (None, 1, 8, 8))], ["y"], nodes, constants)


MODELS = {"mlp": (mlp_graph, (64,)), "cnn": (cnn_graph, (1, 8, 8))}


def noisy_batches(x: np.ndarray, samples: int, shape: tuple[int, ...], seed: int) -> Iterator[dict[str, np.ndarray]]:
    """`samples` rows: digits images drawn at random, plus Gaussian noise, made one batch at a time."""
    rng = np.random.default_rng(seed)
    for start in range(0, samples, BATCH):
        rows = x[rng.integers(0, len(x), min(BATCH, samples - start))]
        noisy = rows + rng.normal(0, 0.05, rows.shape)
        yield {"x": noisy.reshape(-1, *shape).astype(np.float32)}


def child(model: str, samples: int) -> None:
    """One calibration run in this (fresh) process; prints its measurements as JSON."""
    from dabuild.progress import Progress
    from dabuild.quant.calibrate import STATS_FILE, calibrate

    build, shape = MODELS[model]
    graph, x = build(), digits_data()["x_train"]
    calibrate(graph, noisy_batches(x, 2 * BATCH, shape, 0), Progress.silent())  # imports and caches
    tracemalloc.start()
    start = time.perf_counter()
    stats = calibrate(graph, noisy_batches(x, samples, shape, 1), Progress.silent())
    seconds = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    with tempfile.TemporaryDirectory() as folder:
        stats.save(Path(folder))
        size = (Path(folder) / STATS_FILE).stat().st_size
    print(json.dumps({"peak": peak, "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                      "stats_bytes": size, "seconds": seconds}))


def memory_flatness() -> None:
    base = len(digits_data()["x_train"])
    print(f"(a) calibration memory, N = {base} vs 10N = {10 * base} samples (batch {BATCH}, fresh process each)")
    for model in MODELS:
        runs = {}
        for samples in (base, 10 * base):
            out = subprocess.run([sys.executable, __file__, "--child", model, str(samples)], check=True,
                                 capture_output=True, text=True).stdout
            runs[samples] = json.loads(out.strip().splitlines()[-1])
            r = runs[samples]
            print(f"  {model} {samples:>6} samples: tracemalloc peak {r['peak'] / 2**20:7.2f} MiB, "
                  f"max RSS {r['maxrss_kib'] / 1024:7.1f} MiB, stats.npz {r['stats_bytes']} bytes, "
                  f"{r['seconds']:.2f} s")
        small, large = runs[base], runs[10 * base]
        print(f"  {model} ratio 10N/N: tracemalloc peak {large['peak'] / small['peak']:.3f}, "
              f"max RSS {large['maxrss_kib'] / small['maxrss_kib']:.3f}, "
              f"stats.npz {large['stats_bytes'] / small['stats_bytes']:.3f}")


def onnx_mlp(path: Path) -> None:
    """The digits MLP as ONNX (Gemm + Relu, ir_version 8, opset 17) from recipes/digits/weights.npz."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    with np.load(DIGITS / "weights.npz") as weights:
        arrays = {key: weights[key].astype(np.float32) for key in weights.files}
    nodes, source = [], "x"
    for layer in (1, 2, 3):
        out = "logits" if layer == 3 else f"h{layer}"
        gemm = out if layer == 3 else f"g{layer}"
        nodes.append(helper.make_node("Gemm", [source, f"w{layer}", f"b{layer}"], [gemm], name=f"fc{layer}"))
        if layer < 3:
            nodes.append(helper.make_node("Relu", [gemm], [out], name=f"relu{layer}"))
        source = out
    graph = helper.make_graph(
        nodes, "digits_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        [numpy_helper.from_array(array, name) for name, array in arrays.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    onnx.save(model, path)


def ort_accuracies(model: Path, calibration: np.ndarray, x_test: np.ndarray, y_test: np.ndarray,
                   per_channel: bool = False) -> tuple[float, dict[str, float]]:
    """fp32 accuracy of the ONNX `model` and, per calibration method, of its quantize_static int8 version."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    def accuracy(path: Path) -> float:
        return ort_accuracy(path, x_test, y_test, batch_size=len(x_test))

    results = {}
    fp32 = accuracy(model)
    with tempfile.TemporaryDirectory() as folder:
        for method in ("MinMax", "Entropy", "Percentile"):
            quantized = Path(folder) / f"{model.stem}.{method}.onnx"
            with contextlib.redirect_stdout(io.StringIO()):  # its progress prints would interleave with ours
                quantize_static(model, quantized, calibration_reader(calibration, BATCH), quant_format=QuantFormat.QDQ,
                                per_channel=per_channel, activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                                calibrate_method=getattr(CalibrationMethod, method))
            results[method] = accuracy(quantized)
    return fp32, results


def dabuild_accuracies(graph, calibration: np.ndarray, x_test: np.ndarray, y_test: np.ndarray,
                       granularities: tuple[str, ...] = ("per_tensor",)) -> tuple[float, dict[str, float]]:
    """fp32 accuracy of `graph` and its int8 accuracy per (weight granularity,) activation algorithm the C
    capability offers, from one calibration pass; labelled `algorithm` or `granularity algorithm`."""
    from dabuild.capability import load_capability
    from dabuild.ir.interpreter import run
    from dabuild.progress import Progress
    from dabuild.qir.reference import run_quantized
    from dabuild.quant.calibrate import calibrate
    from dabuild.quant.config import NodeConfig, QuantConfig
    from dabuild.quant.defaults import default_config
    from dabuild.quant.quantize import quantize
    from dabuild.resources import data_dir

    capability = load_capability(data_dir("capabilities") / "c.yaml")
    batches = ({"x": calibration[i:i + BATCH]} for i in range(0, len(calibration), BATCH))
    stats = calibrate(graph, batches, Progress.silent())  # one pass serves every algorithm
    fp32 = float(np.mean(run(graph, {"x": x_test})[graph.outputs[0]].argmax(1) == y_test))
    default = default_config(graph, capability)

    def chosen(node: NodeConfig, granularity: str, algorithm: str) -> NodeConfig:
        return dataclasses.replace(node, weight=node.weight and dataclasses.replace(node.weight, granularity=granularity),
                                   activation=node.activation and dataclasses.replace(node.activation,
                                                                                      algorithm=algorithm))

    results = {}
    for granularity in granularities:
        for algorithm in capability.ops["dense"].activation.algorithm:
            config = QuantConfig({name: chosen(node, granularity, algorithm) for name, node in default.nodes.items()})
            qgraph = quantize(graph, stats, config)
            label = algorithm if len(granularities) == 1 else f"{granularity} {algorithm}"
            results[label] = float(np.mean(run_quantized(qgraph, x_test).argmax(1) == y_test))
    return fp32, results


def accuracy_vs_onnxruntime() -> None:
    data = digits_data()
    calibration, x_test, y_test = data["x_train"][:CALIBRATION_SAMPLES], data["x_test"], data["y_test"]
    print(f"(b) digits MLP int8 accuracy, calibration {len(calibration)} rows, evaluation {len(x_test)} rows")
    ours_fp32, ours = dabuild_accuracies(mlp_graph(), calibration, x_test, y_test)
    with tempfile.TemporaryDirectory() as folder:
        onnx_mlp(Path(folder) / "mlp.onnx")
        theirs_fp32, theirs = ort_accuracies(Path(folder) / "mlp.onnx", calibration, x_test, y_test)
    print(f"  fp32: dabuild {ours_fp32:.4f}, onnxruntime {theirs_fp32:.4f}")
    print("  dabuild (int8 asym activations, sym per-tensor weights): "
          + ", ".join(f"{name} {value:.4f}" for name, value in ours.items()))
    print("  onnxruntime quantize_static (QDQ, QInt8, per-tensor): "
          + ", ".join(f"{name} {value:.4f}" for name, value in theirs.items()))
    best_ours, best_theirs = max(ours, key=ours.get), max(theirs, key=theirs.get)
    print(f"  best: dabuild {ours[best_ours]:.4f} ({best_ours}), onnxruntime {theirs[best_theirs]:.4f} "
          f"({best_theirs}); ratio dabuild/onnxruntime {ours[best_ours] / theirs[best_theirs]:.4f}")


def cnn_basic_tune(graph_dir: Path, calibration: np.ndarray, out: Path) -> tuple[dict, str]:
    """The digits CNN recipe's tune stage (strategy `basic`, its accuracy goal, the C capability) on the graph
    in `graph_dir`, calibrated on `calibration`; its metrics and the chosen config's per-node choices."""
    from dabuild.capability import load_capability
    from dabuild.ir.graph import Graph
    from dabuild.pipeline.plan import tune_stage_of
    from dabuild.progress import Progress
    from dabuild.quant.calibrate import calibrate
    from dabuild.quant.config import NodeConfig, QuantConfig
    from dabuild.recipe import load_recipe
    from dabuild.resources import data_dir
    from dabuild.tune.stage import tune_stage

    recipe = load_recipe(DIGITS_CNN / "recipe.yaml")
    batches = ({"x": calibration[i:i + BATCH]} for i in range(0, len(calibration), BATCH))
    calibrate(Graph.load(graph_dir), batches, Progress.silent()).save(out / "calibrate")
    (out / "tune").mkdir()
    stage = tune_stage_of(recipe, load_capability(data_dir("capabilities") / "c.yaml"))
    tune_stage(stage.config, stage.files, graph_dir, out / "calibrate", out / "tune", Progress.silent())
    config = QuantConfig.load(out / "tune" / "config.json")

    def choices(node: NodeConfig) -> str:
        weight = [f"w {node.weight.granularity}/{node.weight.algorithm}"] if node.weight else []
        activation = [f"a {node.activation.scheme}/{node.activation.algorithm}"] if node.activation else []
        return " ".join(weight + activation) or "fp32"

    layout = ", ".join(f"{name} {choices(node)}" for name, node in config.nodes.items())
    return json.loads((out / "tune" / "metrics.json").read_text()), layout


def cnn_accuracy_vs_onnxruntime() -> None:
    from dabuild.ir.graph import Graph
    from dabuild.progress import Progress
    from dabuild.recipe import ModelSpec
    from dabuild.trace.base import trace_stage

    with np.load(DIGITS_CNN / "data.npz") as data:
        calibration, x_test, y_test = data["x_train"][:CALIBRATION_SAMPLES], data["x_test"], data["y_test"]
    model = DIGITS_CNN / "model.onnx"
    print(f"(b) digits CNN (recipes/digits-cnn/model.onnx; dabuild traces it with its onnx frontend) int8 accuracy, "
          f"calibration {len(calibration)} rows, evaluation {len(x_test)} rows")
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        trace_stage(ModelSpec(framework="onnx", source=str(model), inputs={"x": [None, 1, 8, 8]}), root / "trace",
                    Progress.silent())
        ours_fp32, ours = dabuild_accuracies(Graph.load(root / "trace"), calibration, x_test, y_test,
                                             ("per_tensor", "per_channel"))
        tuned, layout = cnn_basic_tune(root / "trace", calibration, root)
    theirs_fp32, theirs = 0.0, {}
    for per_channel in (False, True):
        theirs_fp32, results = ort_accuracies(model, calibration, x_test, y_test, per_channel)
        theirs.update({f"{'per_channel' if per_channel else 'per_tensor'} {k}": v for k, v in results.items()})
    print(f"  fp32: dabuild {ours_fp32:.4f}, onnxruntime {theirs_fp32:.4f}")
    print("  dabuild (int8 asym activations, sym weights): "
          + ", ".join(f"{name} {value:.4f}" for name, value in ours.items()))
    print(f"  dabuild basic (C capability, goal {tuned['metric']} within 1 % relative): {tuned['quantized']:.4f} "
          f"after {tuned['trials']} trials, goal met {tuned['goal_met']}, {tuned['precision']}; {layout}")
    print("  onnxruntime quantize_static (QDQ, QInt8): "
          + ", ".join(f"{name} {value:.4f}" for name, value in theirs.items()))
    best_ours, best_theirs = max(ours, key=ours.get), max(theirs, key=theirs.get)
    print(f"  best: dabuild sweep {ours[best_ours]:.4f} ({best_ours}), dabuild basic {tuned['quantized']:.4f}, "
          f"onnxruntime {theirs[best_theirs]:.4f} ({best_theirs}); ratio dabuild/onnxruntime: "
          f"basic {tuned['quantized'] / theirs[best_theirs]:.4f}, sweep {ours[best_ours] / theirs[best_theirs]:.4f}"
          f" (target >= 1.0)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "SAMPLES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    logging.getLogger().setLevel(logging.ERROR)  # onnxruntime's "consider pre-processing" advice
    if args.child:
        child(args.child[0], int(args.child[1]))
        return
    memory_flatness()
    accuracy_vs_onnxruntime()
    cnn_accuracy_vs_onnxruntime()


if __name__ == "__main__":
    main()
