"""The C target on Cortex-M cores under qemu: instructions per inference, flash and RAM, against peers' figures.

Two int8 models, calibrated and quantized with the C capability's default
choices, exported for each profile, checked bit-exact in qemu on a few
samples, and measured: instructions model_forward retires on one sample
(qemu's exec log, see dabuild/targets/c/firmware.py; counts do not depend
on machine load), the model object's flash (text + rodata) and RAM (arena,
its activation peak and liveness lower bound, kernel scratch, stack).
  (a) the digits CNN of recipes/digits-cnn (its model.onnx and data.npz),
  (b) the ResNet-style 3x32x32 CNN of bench/interpreter.py (random weights, calibrated on random data).
Ratios are to the figures of /work/shared/peers.md (CMSIS-NN alone on the digits CNN, TFLM + CMSIS-NN on
(b)); goals: <= 0.9x CMSIS-NN on Cortex-M4, <= 1.0x on Cortex-M55.

With --cmsis-nn PATH (a CMSIS-NN checkout), the digits CNN is also built with CMSIS-NN's own kernels
(bench/cmsis_nn.py: the same weights, a driver the bench writes, CMSIS_NN_USE_SINGLE_ROUNDING, the same
-O2 and board) and its instructions per inference print beside ours; without it that column is left out.

Usage: python bench/mcu.py [--cpus cortex-m4 cortex-m55] [--models digits-cnn resnet] [--cflags=-O2]
                           [--cmsis-nn /path/to/CMSIS-NN]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from c_target import lowered
from cmsis_nn import count as cmsis_nn_count
from interpreter import resnet_graph

from dabuild.ir.passes import optimize
from dabuild.qir.qgraph import QGraph
from dabuild.qir.reference import run_integer
from dabuild.targets.c import CTarget
from dabuild.trace import trace_model

DIGITS_CNN = Path(__file__).resolve().parent.parent / "recipes" / "digits-cnn"
# peers.md: (model, cpu) -> (peer, instructions per inference)
PEERS = {("digits-cnn", "cortex-m4"): ("CMSIS-NN", 636_889), ("digits-cnn", "cortex-m55"): ("CMSIS-NN", 120_472),
         ("resnet", "cortex-m4"): ("TFLM+CMSIS-NN", 61_100_000)}
GOALS = {"cortex-m4": 0.9, "cortex-m55": 1.0}
CHECKED_SAMPLES = 8


def models() -> dict[str, tuple[QGraph, np.ndarray]]:
    """name -> (QGraph, a few int8 samples)."""
    data = np.load(DIGITS_CNN / "data.npz")
    digits = optimize(trace_model(DIGITS_CNN / "model.onnx"))
    digits_q = lowered(digits, data["x_train"][:512].astype(np.float32))
    rng = np.random.default_rng(0)
    resnet_q = lowered(resnet_graph(), rng.standard_normal((128, 3, 32, 32)).astype(np.float32))
    return {"digits-cnn": (digits_q, digits_q.input_params.quantize(data["x_test"][:CHECKED_SAMPLES])),
            "resnet": (resnet_q, resnet_q.input_params.quantize(rng.standard_normal((CHECKED_SAMPLES, 3, 32, 32))))}


def measure(qgraph: QGraph, samples: np.ndarray, cpu: str, cflags: list[str], folder: Path,
            cmsis_nn: Path | None = None, **options: Any) -> dict:
    """The c target's image of `qgraph` (with further target `options`) checked exact in qemu, and its figures."""
    target = CTarget(CTarget.Options(cpu=cpu, cflags=cflags, **options))
    artifact, run_dir, count_dir = folder / "artifact", folder / "run", folder / "count"
    for path in (artifact, run_dir, count_dir):
        path.mkdir()
    target.export(qgraph, artifact)
    actual = target.run(artifact, samples, run_dir)
    expected = np.asarray(run_integer(qgraph, samples)).reshape(len(samples), -1)
    if not np.array_equal(actual, expected):
        raise SystemExit(f"{cpu}: the image differs from the integer reference in {np.sum(actual != expected)} outputs")
    manifest = json.loads((artifact / "model.json").read_text())
    measured = target.measurements(artifact, samples, count_dir)["firmware"]
    if cmsis_nn is not None:
        measured["cmsis_nn"] = cmsis_nn_count(qgraph, samples[0], target.profile, cmsis_nn, artifact,
                                              folder / "cmsis-nn")
    return {**measured, "arena": manifest["arena"], "streaming": manifest.get("streaming")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpus", nargs="+", default=["cortex-m4", "cortex-m55"])
    parser.add_argument("--models", nargs="+", default=["digits-cnn", "resnet"])
    parser.add_argument("--cflags", default="-O2")
    parser.add_argument("--cmsis-nn", type=Path, default=None, metavar="PATH",
                        help="a CMSIS-NN checkout: build the digits CNN with its kernels, print its counts beside ours")
    args = parser.parse_args()
    rows = []
    for name, (qgraph, samples) in models().items():
        if name not in args.models:
            continue
        for cpu in args.cpus:
            with tempfile.TemporaryDirectory(prefix="dabuild-bench-mcu-") as work:
                figures = measure(qgraph, samples, cpu, args.cflags.split(), Path(work),
                                  args.cmsis_nn if name == "digits-cnn" else None)
            peer, peer_count = PEERS.get((name, cpu), ("-", 0))
            count = figures["instructions_per_inference"]
            ratio = f"{count / peer_count:.2f}x (goal {GOALS.get(cpu, 1.0):.1f}x)" if peer_count else "-"
            arena = figures["arena"]
            here = figures.get("cmsis_nn")
            live = [f"{here:,} ({count / here:.2f}x)" if here else "-"] if args.cmsis_nn else []
            rows.append([name, cpu, f"{count:,}", *live, f"{peer} {peer_count:,}" if peer_count else "-", ratio,
                         f"{figures['text_bytes']:,} + {figures['rodata_bytes']:,}",
                         (f"{arena['peak_bytes']:,} ({arena['activation_lower_bound_bytes']:,} + "
                         f"{arena['scratch_bytes']:,}; bound {arena['lower_bound_bytes']:,})"),
                         f"{figures['stack_bytes']:,}"])
            print(f"measured {name} on {cpu}", file=sys.stderr, flush=True)
    live_header = ["CMSIS-NN built here (ours / it)"] if args.cmsis_nn else []
    header = ["model", "cpu", "instructions", *live_header, "peer (peers.md)", "ratio", "flash text + rodata",
              "arena (activation bound + scratch; bound)", "stack"]
    print(f"bench/mcu.py: qemu 7.2 instruction counts, {args.cflags}, {CHECKED_SAMPLES} samples exact in qemu\n")
    print_table(header, rows)


def print_table(header: list[str], rows: list[list[str]]) -> None:
    """A Markdown table, as the closing notes quote it (bench/tiny.py prints the same way)."""
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
