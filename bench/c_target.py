"""Generated C against onnxruntime on the same int8 models: latency per sample, arena, code size.

Three models, each calibrated, quantized with the C capability's default
choices and exported twice from the same QGraph: by the c target (compiled
-O2, single thread) and by the onnx target (QDQ, run by onnxruntime with one
intra-op thread):
  (a) the digits MLP of recipes/digits,
  (b) a small CNN on the 1x8x8 digits (conv, depthwise, residual add, pools, concat, dense),
  (c) the ResNet-style CNN of bench/interpreter.py at 3x32x32 (random weights, calibrated on random data).
Latency: the C driver times model_forward over the samples in a loop; onnxruntime runs one
sample per call (what a deployment sees), and for reference its per-sample time on one batch.
Each figure is the best of interleaved rounds (load elsewhere only adds time). Targets: C <= 0.5x
onnxruntime for (a) and (b), within 2x for (c); arena peak <= 1.05x the liveness lower bound.
The headline is --cflags (default -O2, baseline ISA); (c) then runs once more with --user-cflags
(default -O2 -march=native), what a user gets by setting the c target's options.cflags.

Usage: python bench/c_target.py [--seconds 2] [--cflags "-O2"] [--user-cflags "-O2 -march=native" | ""]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from interpreter import digits_graph, resnet_graph
from timing import fastest

from dabuild.capability import load_capability
from dabuild.ir import Graph, Node, TensorSpec
from dabuild.ir.passes import optimize
from dabuild.progress import Progress
from dabuild.qir.qgraph import QGraph
from dabuild.qir.reference import run_integer
from dabuild.quant.calibrate import calibrate
from dabuild.quant.defaults import default_config
from dabuild.quant.quantize import quantize
from dabuild.resources import data_dir
from dabuild.targets.c import CTarget

DIGITS = Path(__file__).resolve().parent.parent / "recipes" / "digits"

TIMER = r"""
#define _POSIX_C_SOURCE 199309L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "model.h"

/* argv: inputs.bin samples seconds -> prints the best nanoseconds per sample over rounds of all samples */
int main(int argc, char **argv)
{
    static int8_t in[1 << 24];
    int8_t out[MODEL_OUTPUT_SIZE];
    long samples = atol(argv[2]), s;
    double seconds = atof(argv[3]), best = 1e30, spent = 0;
    volatile int8_t sink = 0;
    FILE *f = fopen(argv[1], "rb");
    if (argc != 4 || f == NULL || fread(in, MODEL_INPUT_SIZE, (size_t)samples, f) != (size_t)samples) {
        return 1;
    }
    fclose(f);
    while (spent < seconds) {
        struct timespec a, b;
        double ns;
        clock_gettime(CLOCK_MONOTONIC, &a);
        for (s = 0; s < samples; ++s) {
            model_forward(in + s * MODEL_INPUT_SIZE, out);
            sink ^= out[0];
        }
        clock_gettime(CLOCK_MONOTONIC, &b);
        ns = (b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec);
        spent += ns * 1e-9;
        if (ns / samples < best) {
            best = ns / samples;
        }
    }
    printf("%.1f\n", best);
    return 0;
}
"""


def cnn_graph(seed: int = 0, channels: int = 16) -> Graph:
    """A small CNN for 1x8x8 digits with random weights."""
    rng = np.random.default_rng(seed)
    constants = {"c1_w": rng.normal(0, 1 / 3, (channels, 1, 3, 3)), "c1_b": rng.normal(0, 0.1, channels),
                 "dw_w": rng.normal(0, 1 / 3, (channels, 1, 3, 3)), "dw_b": np.zeros(channels),
                 "pw_w": rng.normal(0, 1 / np.sqrt(channels), (channels, channels, 1, 1)), "pw_b": np.zeros(channels),
                 "c2_w": rng.normal(0, 1 / np.sqrt(9 * channels), (2 * channels, channels, 3, 3)),
                 "c2_b": np.zeros(2 * channels),
                 "fc_w": rng.normal(0, 1 / np.sqrt(4 * channels), (4 * channels, 10)), "fc_b": np.zeros(10)}
    nodes = [
        Node("c1", "conv", ["x", "c1_w", "c1_b"], ["h1"], {"pads": [1, 1, 1, 1], "activation": "relu"}),
        Node("dw", "conv", ["h1", "dw_w", "dw_b"], ["h2"], {"pads": [1, 1, 1, 1], "groups": channels,
                                                            "activation": "relu"}),
        Node("pw", "conv", ["h2", "pw_w", "pw_b"], ["h3"], {}),
        Node("residual", "add", ["h3", "h1"], ["r"], {}),
        Node("act", "relu", ["r"], ["a"], {}),
        Node("maxp", "max_pool", ["a"], ["m"], {"kernel": [2, 2]}),
        Node("c2", "conv", ["m", "c2_w", "c2_b"], ["h4"], {"pads": [1, 1, 1, 1], "activation": "relu"}),
        Node("avgp", "avg_pool", ["a"], ["p"], {"kernel": [2, 2]}),
        Node("both", "concat", ["h4", "p", "m"], ["c"], {"axis": 1}),
        Node("gap", "global_avg_pool", ["c"], ["g"], {}),
        Node("flat", "flatten", ["g"], ["f"], {}),
        Node("fc", "dense", ["f", "fc_w", "fc_b"], ["y"], {}),
    ]
    return optimize(Graph([TensorSpec("x", (None, 1, 8, 8))], ["y"], nodes,
                          {name: np.asarray(value, np.float32) for name, value in constants.items()}))


def lowered(graph: Graph, calibration: np.ndarray) -> QGraph:
    name = graph.inputs[0].name
    stats = calibrate(graph, ({name: calibration[i:i + 64]} for i in range(0, len(calibration), 64)),
                      Progress.silent())
    return quantize(graph, stats, default_config(graph, load_capability(data_dir("capabilities") / "c.yaml")))


def onnx_model(qgraph: QGraph, graph: Graph, folder: Path) -> tuple[bytes, str]:
    """The QDQ export of the onnx target, or (until it exists) the float graph as a stand-in."""
    try:
        from dabuild.targets.onnx import OnnxTarget
    except ImportError:
        from dabuild.targets.onnx_float import to_onnx
        return to_onnx(graph).SerializeToString(), "float ONNX stand-in (no onnx target yet)"
    folder.mkdir()
    OnnxTarget().export(qgraph, folder)
    return (folder / "model.onnx").read_bytes(), "QDQ int8"


def code_size(artifact: Path, cflags: list[str]) -> tuple[int, int]:
    """(.text, .rodata) bytes of the compiled model.o (constants included, driver excluded)."""
    subprocess.run(["cc", "-std=c99", *cflags, "-c", "-o", str(artifact / "model.o"), str(artifact / "model.c")],
                   check=True)
    sections = subprocess.run(["size", "-A", str(artifact / "model.o")], capture_output=True, text=True,
                              check=True).stdout
    sizes = {line.split()[0]: int(line.split()[1]) for line in sections.splitlines()
             if line.startswith(".") and len(line.split()) >= 2}
    text = sum(v for k, v in sizes.items() if k.startswith(".text"))
    rodata = sum(v for k, v in sizes.items() if k.startswith(".rodata"))
    return text, rodata


def bench(name: str, graph: Graph, calibration: np.ndarray, samples: np.ndarray, seconds: float,
          cflags: list[str], ratio_target: float) -> None:
    import onnxruntime as ort

    qgraph = lowered(graph, calibration)
    with tempfile.TemporaryDirectory(prefix="dabuild-bench-c-") as work:
        folder = Path(work)
        artifact = folder / "c"
        artifact.mkdir()
        target = CTarget(CTarget.Options(cflags=cflags))
        target.export(qgraph, artifact)
        x_q = qgraph.input_params.quantize(samples)
        assert np.array_equal(target.run(artifact, x_q, folder),
                              np.asarray(run_integer(qgraph, x_q)).reshape(len(x_q), -1)), "C differs from the reference"
        manifest = json.loads((artifact / "model.json").read_text())
        (folder / "timer.c").write_text(TIMER)
        subprocess.run(["cc", "-std=c99", *cflags, "-I", str(artifact), "-o", str(folder / "timer"),
                        str(folder / "timer.c"), str(artifact / "model.c")], check=True)
        x_q.tofile(folder / "inputs.bin")
        text, rodata = code_size(artifact, cflags)

        model, kind = onnx_model(qgraph, graph, folder / "onnx")
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        feed_name = session.get_inputs()[0].name
        one = samples[:1].astype(np.float32)
        c_ns = ort_ns = ort_batch_ns = math.inf
        for _ in range(2):  # interleaved rounds
            run = subprocess.run([str(folder / "timer"), str(folder / "inputs.bin"), str(len(x_q)), str(seconds / 2)],
                                 capture_output=True, text=True, check=True)
            c_ns = min(c_ns, float(run.stdout))
            ort_ns = min(ort_ns, 1e9 * fastest(lambda: session.run(None, {feed_name: one}), seconds / 2))
            ort_batch_ns = min(ort_batch_ns, 1e9 * fastest(
                lambda: session.run(None, {feed_name: samples.astype(np.float32)}), seconds / 4) / len(samples))
    arena = manifest["arena"]
    ratio = c_ns / ort_ns
    print(f"{name}")
    print(f"  latency/sample  C {c_ns / 1e3:9.2f} us   onnxruntime ({kind}, batch 1) {ort_ns / 1e3:9.2f} us   "
          f"ratio {ratio:5.2f} (target <= {ratio_target:g}: {'met' if ratio <= ratio_target else 'NOT met'})"
          f"   [onnxruntime batch {len(samples)}: {ort_batch_ns / 1e3:.2f} us/sample]")
    print(f"  arena           peak {arena['peak_bytes']} B   lower bound {arena['lower_bound_bytes']} B "
          f"(peak/bound {arena['peak_bytes'] / max(arena['lower_bound_bytes'], 1):.3f})   "
          f"naive sum {arena['naive_bytes']} B")
    print(f"  code size       text {text} B + rodata {rodata} B = {text + rodata} B  (model.o, {' '.join(cflags)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="timed seconds per side per model")
    parser.add_argument("--cflags", default="-O2", help="C compiler flags (default -O2)")
    parser.add_argument("--user-cflags", default="-O2 -march=native",
                        help="flags of one more run of (c), as a user's options.cflags ('' skips it)")
    args = parser.parse_args()
    cflags = args.cflags.split()
    data = np.load(DIGITS / "data.npz")
    rng = np.random.default_rng(1)
    bench("(a) digits MLP 64-32-16-10", digits_graph(), data["x_train"][:512], data["x_test"][:256], args.seconds,
          cflags, 0.5)
    images = (data["x_train"][:512] / 16).reshape(-1, 1, 8, 8).astype(np.float32)
    bench("(b) small CNN on 1x8x8 digits", cnn_graph(), images, (data["x_test"][:256] / 16).reshape(-1, 1, 8, 8)
          .astype(np.float32), args.seconds, cflags, 0.5)
    resnet = resnet_graph(), rng.standard_normal((128, 3, 32, 32)).astype(np.float32), \
        rng.standard_normal((32, 3, 32, 32)).astype(np.float32)
    bench("(c) ResNet-style CNN, 3x32x32", *resnet, args.seconds, cflags, 2.0)
    if args.user_cflags.strip():
        bench(f"(c) again, cflags {args.user_cflags}", *resnet, args.seconds, args.user_cflags.split(), 2.0)


if __name__ == "__main__":
    main()
