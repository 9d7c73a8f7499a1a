"""MLPerf Tiny's models on Cortex-M cores under qemu: instructions per inference, flash and arena, against TFLM.

The five models of tests/mlperf_tiny.py (written from mlcommons/tiny's reference architectures, random
weights, int8 with per-channel weights), each exported by the c target for each CPU, checked bit-exact in
qemu against the integer reference on a few samples, and measured as bench/mcu.py measures: instructions
model_forward retires on one sample (qemu 7.2's exec log), the model object's flash (text + rodata) and its
arena: its peak, the activations' liveness bound (the most activation bytes alive at one step, which no plan
without patch-based execution can beat), the largest kernel scratch, and the peak's ratio to that bound.

The peer line is TFLM with CMSIS-NN kernels on the same reference architectures converted by TensorFlow, as
/work/shared/peers.md records it (measured in the same qemu 7.2 on mps2-an386 and mps3-an547; not measured in
this run). peers.md has no figures for Cortex-M7 and M33, nor for the streaming wake-word model: '-' there.
Beside the instructions, the cycles they would take on the core (dabuild.targets.c.cycles: instruction classes
from the same exec log, priced by the Cortex-M4 and M55 timing that module states; no flash wait states), and on
the Cortex-M4 the published MLPerf Tiny cycles of STM32Cube.AI (KWS, VWW, IC) and Plumerai (AD), which include
wait states.
Goals: instructions <= 0.8x TFLM+CMSIS-NN's on every model and CPU; estimated M4 cycles below the published
ones; arena within 10 % of the liveness bound.

Usage: python bench/tiny.py [--models kws vww ic ad wakeword] [--cpus cortex-m4 cortex-m7 cortex-m33 cortex-m55]
                            [--cflags=-O2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from mcu import measure, print_table
from mlperf_tiny import MODELS, quantized

# peers.md, MLPerf Tiny: (model, cpu) -> TFLM+CMSIS-NN instructions per inference; model -> TFLM arena bytes
PEERS = {("kws", "cortex-m4"): 7_699_242, ("kws", "cortex-m55"): 1_816_698,
         ("vww", "cortex-m4"): 24_101_658, ("vww", "cortex-m55"): 6_558_020,
         ("ic", "cortex-m4"): 29_856_287, ("ic", "cortex-m55"): 4_913_649,
         ("ad", "cortex-m4"): 595_934, ("ad", "cortex-m55"): 155_845}
PEER_ARENA = {"kws": 22_820, "vww": 100_644, "ic": 54_996, "ad": 15_956}
# peers.md, published MLPerf Tiny closed-division latency x clock on a Cortex-M4 (STM32Cube.AI on an STM32L4R5 at
# 120 MHz for KWS, VWW and IC; Plumerai for AD): cycles, flash wait states included
PUBLISHED_M4_CYCLES = {"kws": ("Cube.AI", 5_200_000), "vww": ("Cube.AI", 10_700_000), "ic": ("Cube.AI", 19_800_000),
                       "ad": ("Plumerai", 490_000)}
GOAL = 0.8
ARENA_GOAL = 1.1
CHECKED_SAMPLES = 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--cpus", nargs="+", default=["cortex-m4", "cortex-m7", "cortex-m33", "cortex-m55"])
    parser.add_argument("--cflags", default="-O2")
    args = parser.parse_args()
    rows = []
    for name in args.models:
        qgraph, data = quantized(name)
        samples = qgraph.input_params.quantize(data[:CHECKED_SAMPLES])
        for cpu in args.cpus:
            with tempfile.TemporaryDirectory(prefix="dabuild-bench-tiny-") as work:
                figures = measure(qgraph, samples, cpu, args.cflags.split(), Path(work))
            count, peer = figures["instructions_per_inference"], PEERS.get((name, cpu))
            arena = figures["arena"]
            peer_arena = PEER_ARENA.get(name)
            estimated = figures.get("estimated_cycles_per_inference")
            published = PUBLISHED_M4_CYCLES[name] if cpu == "cortex-m4" and name in PUBLISHED_M4_CYCLES else None
            rows.append([name, cpu, f"{count:,}", f"{estimated:,}" if estimated else "-",
                         (f"{published[0]} {published[1]:,} ({estimated / published[1]:.2f}x)"
                          if published and estimated else "-"),
                         f"{peer:,}" if peer else "-",
                         f"{count / peer:.2f}x" if peer else "-",
                         f"{figures['text_bytes']:,} + {figures['rodata_bytes']:,}",
                         (f"{arena['peak_bytes']:,} ({arena['activation_lower_bound_bytes']:,} + "
                          f"{arena['scratch_bytes']:,})"),
                         f"{arena['peak_bytes'] / max(arena['activation_lower_bound_bytes'], 1):.2f}x",
                         f"{peer_arena:,}" if peer_arena else "-"])
            print(f"measured {name} on {cpu}", file=sys.stderr, flush=True)
    header = ["model", "cpu", "instructions", "estimated cycles", "published M4 cycles (goal: below)",
              "TFLM+CMSIS-NN (peers.md)", f"ratio (goal {GOAL}x)",
              "flash text + rodata", "arena (activation bound + largest scratch)",
              f"arena / bound (goal {ARENA_GOAL}x)", "TFLM arena (peers.md)"]
    print(f"bench/tiny.py: qemu 7.2 instructions per inference, {args.cflags}, {CHECKED_SAMPLES} samples exact "
          "in qemu; peer figures from /work/shared/peers.md, not measured in this run; estimated cycles from "
          "dabuild.targets.c.cycles' timing model (M4 and M55 only; no flash wait states)\n")
    print_table(header, rows)


if __name__ == "__main__":
    main()
