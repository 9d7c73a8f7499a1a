"""Calibration cost against inference: calibrate() over N images / the interpreter's inference of the same images.

Exports each family of tests/architectures.py at its published size (random weights, 3x224x224),
traces and optimises it as the trace stage does, and times, in one process and
interleaved, (a) the Interpreter running the images in batches as the
calibrate stage's data would come (batch 64, all cores: batches split across
threads) and (b) `dabuild.quant.calibrate.calibrate` on the same batches (the
calibrate stage's work without its file I/O: a histogram of every tensor, and
with --per-channel, as a recipe with tuning.bias_correction has it, of every channel too). Prints both times
by wall clock and by the process's CPU time (which other load on the machine inflates less) and calibrate /
inference (goal <= 1.5, issue 13). The first calibration also pays for allocating the histograms (16 KiB a
tensor, and 8 KiB per channel of every tensor with --per-channel), a cost that does not grow with N.

Usage: python bench/calibration_speed.py [--models resnet ...] [--images 128] [--batch 64] [--rounds 1]
                                         [--per-channel]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the families' one definition
from architectures import FAMILIES, IMAGE, export_onnx

from dabuild.ir.graph import Graph
from dabuild.ir.interpreter import Interpreter
from dabuild.ir.kernels.compiling import available_cores
from dabuild.ir.kernels.native import native_backend
from dabuild.ir.passes import optimize
from dabuild.progress import Progress
from dabuild.quant.calibrate import calibrate
from dabuild.trace import trace_model


def timed(work: Callable[[], object]) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    work()
    return time.perf_counter() - wall, time.process_time() - cpu


def fastest(graph: Graph, batches: list[dict[str, np.ndarray]], rounds: int,
            per_channel: bool) -> tuple[tuple[float, float], ...]:
    """The fastest (wall, CPU) seconds of inference and of calibration over `batches`, in interleaved rounds."""
    interpreter = Interpreter(graph, threads=available_cores())

    def infer() -> None:
        for batch in batches:
            interpreter.run(batch)

    inference = calibration = (float("inf"), float("inf"))
    for _ in range(rounds):
        once = timed(infer)
        inference = (min(inference[0], once[0]), min(inference[1], once[1]))
        once = timed(lambda: calibrate(graph, batches, Progress.silent(), per_channel=per_channel))
        calibration = (min(calibration[0], once[0]), min(calibration[1], once[1]))
    return inference, calibration


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["resnet"], choices=[family.name for family in FAMILIES])
    parser.add_argument("--images", type=int, default=128)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds; the fastest of each is kept")
    parser.add_argument("--per-channel", action="store_true",
                        help="per-channel histograms too, as calibrate keeps them for bias correction")
    args = parser.parse_args()
    kept = "per tensor and per channel" if args.per_channel else "per tensor"
    print(f"convs: {native_backend()}, {available_cores()} cores, {args.images} images in batches of {args.batch}, "
          f"histograms {kept}  (goal: calibrate / inference <= 1.5)")
    images = np.random.default_rng(1).standard_normal((args.images, *IMAGE)).astype(np.float32)
    with tempfile.TemporaryDirectory(prefix="dabuild-calibration-speed-") as work:
        for name in args.models:
            graph = optimize(trace_model(export_onnx(name, Path(work) / f"{name}.onnx")))
            feed = graph.inputs[0].name
            batches = [{feed: images[low:low + args.batch]} for low in range(0, args.images, args.batch)]
            inference, calibration = fastest(graph, batches, args.rounds, args.per_channel)
            for index, clock in enumerate(("wall", "cpu")):
                print(f"{name:<14} {clock:<4}  inference {inference[index]:7.2f} s  calibrate {calibration[index]:7.2f} s"
                      f"  ratio {calibration[index] / inference[index]:5.2f}", flush=True)


if __name__ == "__main__":
    main()
