"""Streaming wake-word on Cortex-M under qemu: instructions of one hop against a whole window.

MLPerf Tiny v1.3's streaming wake-word runs a 1-D DS-CNN once per 32 ms hop. tests/mlperf_tiny.py's `wakeword`
(40 features x 30 frames, depthwise kernels 3, 5, 10 and 15, valid padding) is exported twice per CPU by the c
target: as a whole-window model (model_forward on 30 frames) and with `streaming: {hop: 1}` (model_step on the
hop's one new frame, each depthwise conv keeping its last k - 1 input frames as state). Both images are first
checked bit-exact in qemu against the integer reference on the whole window (the streaming one runs each window
as 30 calls after a reset). Then, from qemu's exec log (bench/mcu.py's measure): the instructions model_forward
retires on one window, and the instructions of one model_step past the warm-up (the 30th call of a window);
their ratio is the fraction of the whole-window work one hop costs, and the cycles both would take by the
core's published timing (dabuild.targets.c.cycles; flash wait states not included). RAM: the whole-window arena against the
streaming arena plus its state (both static, in the image's bss).

Usage: python bench/streaming.py [--cpus cortex-m4 cortex-m55] [--cflags=-O2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from mcu import measure, print_table
from mlperf_tiny import quantized

CHECKED_SAMPLES = 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpus", nargs="+", default=["cortex-m4", "cortex-m55"])
    parser.add_argument("--cflags", default="-O2")
    args = parser.parse_args()
    qgraph, data = quantized("wakeword")
    samples = qgraph.input_params.quantize(data[:CHECKED_SAMPLES])
    rows = []
    for cpu in args.cpus:
        with tempfile.TemporaryDirectory(prefix="dabuild-bench-streaming-") as work:
            (Path(work) / "window").mkdir()
            (Path(work) / "stream").mkdir()
            window = measure(qgraph, samples, cpu, args.cflags.split(), Path(work) / "window")
            stream = measure(qgraph, samples, cpu, args.cflags.split(), Path(work) / "stream", streaming={"hop": 1})
        whole, hop = window["instructions_per_inference"], stream["instructions_per_hop"]
        state = stream["streaming"]["state_bytes"]
        whole_cycles, hop_cycles = window.get("estimated_cycles_per_inference"), stream.get("estimated_cycles_per_hop")
        cycles = f"{hop_cycles:,} / {whole_cycles:,}" if whole_cycles and hop_cycles else "-"
        rows.append([cpu, f"{whole:,}", f"{hop:,}", f"{hop / whole:.3f} (1/{whole / hop:.1f})", cycles,
                     f"{stream['instructions_per_inference']:,}", f"{window['arena']['peak_bytes']:,}",
                     f"{stream['arena']['peak_bytes']:,} + {state:,}", f"{window['ram_bytes']:,} / {stream['ram_bytes']:,}"])
    print(f"wakeword (1-D DS-CNN, 40 x 30 frames), hop 1 frame, {args.cflags}; every image exact in qemu on "
          f"{CHECKED_SAMPLES} windows")
    print_table(["cpu", "whole window (instructions)", "one hop (instructions)", "hop / window",
                 "est. cycles hop / window (no wait states)",
                 "window as 30 hops", "arena whole", "arena + state streaming", "RAM whole / streaming (B)"], rows)


if __name__ == "__main__":
    main()
