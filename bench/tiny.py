"""MLPerf Tiny's models on Cortex-M cores under qemu: instructions per inference, flash and arena, against TFLM.

The five models of tests/mlperf_tiny.py (written from mlcommons/tiny's reference architectures, random
weights, int8 with per-channel weights), each exported by the c target for each CPU, checked bit-exact in
qemu against the integer reference on a few samples, and measured as bench/mcu.py measures: instructions
model_forward retires on one sample (qemu 7.2's exec log), the model object's flash (text + rodata) and its
arena: its peak, the activations' liveness bound (the most activation bytes alive at one step, which no plan
without patch-based execution can beat), the largest kernel scratch, and the peak's ratio to that bound;
where the c target patched the first convs, the last column gives them and the peak against the
layer-by-layer bound.

The peer line is TFLM with CMSIS-NN kernels on the same reference architectures converted by TensorFlow, as
/work/shared/peers.md records it (measured in the same qemu 7.2 on mps2-an386 and mps3-an547; not measured in
this run). peers.md has no figures for Cortex-M7 and M33, nor for the streaming wake-word model: '-' there.
Beside the instructions, the cycles they would take on the core (dabuild.targets.c.cycles: instruction classes
from the same exec log, priced by the Cortex-M4 and M55 timing that module states; no flash wait states), and on
the Cortex-M4 the published MLPerf Tiny cycles of STM32Cube.AI (KWS, VWW, IC) and Plumerai (AD), which include
wait states.
Goals: instructions <= 0.8x TFLM+CMSIS-NN's on every model and CPU; estimated M4 cycles below the published
ones; arena within 10 % of the liveness bound.

With --tflm DIR (a folder of the tflite-micro, CMSIS-NN, CMSIS_6, flatbuffers, gemmlowp and ruy checkouts;
bench/tflm_peer.py says which commits), the peer is measured in this run instead, on every CPU: each model's
QGraph written as an int8 .tflite by dabuild's tflite target (float32 scales, TFLM's rounding), run by TFLM with
CMSIS-NN kernels built here (default double rounding) in the same qemu board on the same samples: its
instructions per inference, the arena it used (arena_used_bytes) and how many output bytes differ from the c
target's (dabuild's rounding, float64 scales: the row's own build) and from the integer reference of the file's
QGraph with rounding tflm (what the c target computes with `rounding: tflm`; goal 0). A model the tflite target
cannot write shows what it refused.

With --functions, after the table, where each inference went: per model and CPU, the functions of the image
(a layer's forward function is named after the layer) that took at least 1 % of its estimated cycles (of its
instructions on a core without a timing model), with their instructions and estimated cycles.

Usage: python bench/tiny.py [--models kws vww ic ad wakeword] [--cpus cortex-m4 cortex-m7 cortex-m33 cortex-m55]
                            [--cflags=-O2] [--tflm DIR] [--functions]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from mcu import measure, print_table
from mlperf_tiny import MODELS, quantized
from tflm_peer import Checkouts, PeerMissing
from tflm_peer import measure as tflm_measure

from dabuild.errors import UsageError
from dabuild.qir.qgraph import QGraph
from dabuild.qir.reference import run_integer
from dabuild.targets.c.profiles import PROFILES
from dabuild.targets.tflite import MODEL_FILE, TfliteTarget

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
PATCH_GOAL = 0.6
FLASH_GOAL = 1.0  # flash at most TFLM's for the model: its flatbuffer plus its library
CHECKED_SAMPLES = 4
FUNCTION_SHARE = 0.01   # --functions lists the functions of at least this share of an inference


def function_rows(name: str, cpu: str, functions: dict[str, dict[str, int]]) -> list[list[str]]:
    """The functions of one inference that took at least FUNCTION_SHARE of its estimated cycles (of its
    instructions where the core has no estimate), most first, then the others as one line."""
    estimated = all("estimated_cycles" in share for share in functions.values())
    key = "estimated_cycles" if estimated else "instructions"
    total = sum(share[key] for share in functions.values())

    def row(function: str, instructions: int, measure: int, cycles: int) -> list[str]:
        return [name, cpu, function, f"{instructions:,}", f"{cycles:,}" if estimated else "-", f"{measure / total:.1%}"]

    major = {function: share for function, share in functions.items() if share[key] >= FUNCTION_SHARE * total}
    minor = [share for function, share in functions.items() if function not in major]
    rows = [row(function, share["instructions"], share[key], share.get("estimated_cycles", 0))
            for function, share in major.items()]
    if minor:
        rows.append(row(f"({len(minor)} others)", sum(share["instructions"] for share in minor),
                        sum(share[key] for share in minor), sum(share.get("estimated_cycles", 0) for share in minor)))
    return rows


def _patched(arena: dict) -> str:
    """The patched stage (dabuild/targets/c/patch.py), if any: its layers and the arena's peak against the
    layer-by-layer activation bound, which no plan without it can beat."""
    stage = arena.get("patch")
    if not stage:
        return "-"
    bound = arena["layer_by_layer"]["activation_lower_bound_bytes"]
    return (f"{len(stage['layers'])} ({stage['layers'][0]}..{stage['layers'][-1]}), "
            f"{arena['peak_bytes'] / bound:.2f}x of {bound:,}")


def tflite_file(qgraph: QGraph, folder: Path) -> tuple[Path, QGraph] | str:
    """The tflite target's file of `qgraph` in `folder` and the QGraph TFLM computes from it; or what it refused."""
    target = TfliteTarget(TfliteTarget.Options(litert=False))
    graph = target.integer_graph(qgraph)
    try:
        target.export(graph, folder)
    except UsageError as error:
        refused = [line.strip() for line in str(error).splitlines()[1:]] or [str(error)]
        return f"tflite target refused {len(refused)} layers, the first: {refused[0]}"
    return folder / MODEL_FILE, graph


def measured_peer(peer: tuple[Path, QGraph], qgraph: QGraph, samples: np.ndarray, cpu: str, checkouts: Checkouts,
                  work: Path) -> tuple[int, int, int, str]:
    """TFLM+CMSIS-NN's instructions, arena and flash (flatbuffer + library) on `cpu`, and its output bytes
    differing from the c target's and from the file's integer reference with rounding tflm."""
    file, graph = peer
    figures = tflm_measure(file, graph, samples, PROFILES[cpu], checkouts, work / "artifact", work / "tflm")
    assert figures.instructions is not None
    outputs = figures.outputs.reshape(len(samples), -1)
    differ = [int(np.sum(np.asarray(run_integer(reference, samples)).reshape(outputs.shape) != outputs))
              for reference in (qgraph, graph)]
    return (figures.instructions, figures.arena_bytes, figures.flash_bytes,
            f"{differ[0]} / {differ[1]} of {outputs.size}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--cpus", nargs="+", default=["cortex-m4", "cortex-m7", "cortex-m33", "cortex-m55"])
    parser.add_argument("--cflags", default="-O2")
    parser.add_argument("--tflm", type=Path, metavar="DIR", default=None,
                        help="the peer checkouts' folder: measure TFLM+CMSIS-NN in this run (bench/tflm_peer.py)")
    parser.add_argument("--functions", action="store_true",
                        help="also list, per model and CPU, the functions that took 1 %% or more of an inference")
    args = parser.parse_args()
    try:
        checkouts = Checkouts(args.tflm) if args.tflm else None
    except PeerMissing as missing:
        parser.error(str(missing))
    rows, functions = [], []
    for name in args.models:
        qgraph, data = quantized(name)
        samples = qgraph.input_params.quantize(data[:CHECKED_SAMPLES])
        files = tempfile.TemporaryDirectory(prefix="dabuild-bench-tiny-tflite-")
        peer_file = tflite_file(qgraph, Path(files.name)) if checkouts else None
        for cpu in args.cpus:
            differ, peer_flash = "-", None
            with tempfile.TemporaryDirectory(prefix="dabuild-bench-tiny-") as work:
                figures = measure(qgraph, samples, cpu, args.cflags.split(), Path(work))
                peer, peer_arena = PEERS.get((name, cpu)), PEER_ARENA.get(name)
                if checkouts is not None:
                    peer, peer_arena, peer_flash, differ = (
                        measured_peer(peer_file, qgraph, samples, cpu, checkouts, Path(work))
                        if isinstance(peer_file, tuple) else (None, None, None, str(peer_file)))
            count = figures["instructions_per_inference"]
            arena = figures["arena"]
            estimated = figures.get("estimated_cycles_per_inference")
            published = PUBLISHED_M4_CYCLES[name] if cpu == "cortex-m4" and name in PUBLISHED_M4_CYCLES else None
            rows.append([name, cpu, f"{count:,}", f"{estimated:,}" if estimated else "-",
                         (f"{published[0]} {published[1]:,} ({estimated / published[1]:.2f}x)"
                          if published and estimated else "-"),
                         f"{peer:,}" if peer else "-",
                         f"{count / peer:.2f}x" if peer else "-",
                         f"{figures['text_bytes']:,} + {figures['rodata_bytes']:,}",
                         *([f"{peer_flash:,} ({figures['flash_bytes'] / peer_flash:.2f}x)" if peer_flash else "-"]
                           if checkouts else []),
                         (f"{arena['peak_bytes']:,} ({arena['activation_lower_bound_bytes']:,} + "
                          f"{arena['scratch_bytes']:,})"),
                         f"{arena['peak_bytes'] / max(arena['activation_lower_bound_bytes'], 1):.2f}x",
                         f"{peer_arena:,}" if peer_arena else "-", _patched(arena),
                         *([differ] if checkouts else [])])
            functions += function_rows(name, cpu, figures["functions"])
            print(f"measured {name} on {cpu}", file=sys.stderr, flush=True)
        files.cleanup()
    source = "measured here" if checkouts else "peers.md"
    header = ["model", "cpu", "instructions", "estimated cycles", "published M4 cycles (goal: below)",
              f"TFLM+CMSIS-NN ({source})", f"ratio (goal {GOAL}x)",
              "flash text + rodata",
              *([f"TFLM flash: flatbuffer + library (dabuild's flash / it, goal <= {FLASH_GOAL}x)"]
                if checkouts else []),
              "arena (activation bound + largest scratch)",
              f"arena / bound (goal {ARENA_GOAL}x)", f"TFLM arena ({source})",
              f"patched: layers, peak / layer-by-layer bound (VWW goal {PATCH_GOAL}x)",
              *(["TFLM output bytes differing from c (dabuild rounding) / from reference (rounding tflm)"]
                if checkouts else [])]
    peers = ("TFLM+CMSIS-NN measured in this run (the tflite target's file, CMSIS-NN double rounding, -O2)"
             if checkouts else "peer figures from /work/shared/peers.md, not measured in this run")
    print(f"bench/tiny.py: qemu 7.2 instructions per inference, {args.cflags}, {CHECKED_SAMPLES} samples exact "
          f"in qemu; {peers}; estimated cycles from "
          "dabuild.targets.c.cycles' timing model (M4 and M55 only; no flash wait states)\n")
    print_table(header, rows)
    if args.functions:
        print("\nWhere each inference went (estimated cycles; instructions only where the core has no estimate):\n")
        print_table(["model", "cpu", "function", "instructions", "estimated cycles", "share"], functions)


if __name__ == "__main__":
    main()
