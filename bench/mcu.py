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

Usage: python bench/mcu.py [--cpus cortex-m4 cortex-m55] [--models digits-cnn resnet] [--cflags=-O2]
(no CMSIS-NN column: CMSIS-NN was not available to build here; its figures come from peers.md)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from c_target import lowered
from interpreter import resnet_graph

from dabuild.ir.passes import optimize
from dabuild.quant.qgraph import QGraph
from dabuild.quant.reference import run_integer
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


def measure(qgraph: QGraph, samples: np.ndarray, cpu: str, cflags: list[str], folder: Path) -> dict:
    target = CTarget(CTarget.Options(cpu=cpu, cflags=cflags))
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
    return {**measured, "arena": manifest["arena"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpus", nargs="+", default=["cortex-m4", "cortex-m55"])
    parser.add_argument("--models", nargs="+", default=["digits-cnn", "resnet"])
    parser.add_argument("--cflags", default="-O2")
    args = parser.parse_args()
    rows = []
    for name, (qgraph, samples) in models().items():
        if name not in args.models:
            continue
        for cpu in args.cpus:
            with tempfile.TemporaryDirectory(prefix="dabuild-bench-mcu-") as work:
                figures = measure(qgraph, samples, cpu, args.cflags.split(), Path(work))
            peer, peer_count = PEERS.get((name, cpu), ("-", 0))
            count = figures["instructions_per_inference"]
            ratio = f"{count / peer_count:.2f}x (goal {GOALS.get(cpu, 1.0):.1f}x)" if peer_count else "-"
            arena = figures["arena"]
            rows.append([name, cpu, f"{count:,}", f"{peer} {peer_count:,}" if peer_count else "-", ratio,
                         f"{figures['text_bytes']:,} + {figures['rodata_bytes']:,}",
                         (f"{arena['peak_bytes']:,} ({arena['activation_lower_bound_bytes']:,} + "
                         f"{arena['scratch_bytes']:,}; bound {arena['lower_bound_bytes']:,})"),
                         f"{figures['stack_bytes']:,}"])
            print(f"measured {name} on {cpu}", file=sys.stderr, flush=True)
    header = ["model", "cpu", "instructions", "peer", "ratio", "flash text + rodata",
              "arena (activation bound + scratch; bound)", "stack"]
    print(f"bench/mcu.py: qemu 7.2 instruction counts, {args.cflags}, {CHECKED_SAMPLES} samples exact in qemu\n")
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
