"""The committed .tflite models through dabuild, against TFLite Micro's own interpreter (the tflite-micro package).

Per model (tests/tflite_models): the import time (trace and graph passes),
the file's size and the bytes the C target stores for it on a Cortex-M4
(weights and requantization constants), and, for the quantized files, how
many output bytes of dabuild's integer reference (the file rebuilt as given,
as the C target computes it) differ from TFLM's on the same inputs, with
dabuild's rounding and with TFLM's (`rounding: tflm`; goal 0), with TFLM's arena size (what its
RecordingMicroAllocator reports); a 16x8 file's C bytes are those of its 16-bit kernels
(int8 weights, interleaved for SMLAD where a dense or conv takes wide_*_mcu, int64 sums, the int16 softmax's two
tables). Then the tflite target: the file it writes from the
rebuilt QGraph, its size against the original's, how many of its output bytes
in TFLM differ from the original file's in TFLM (goal 0), and the arena TFLM
needs for it; a model with layers the target cannot write shows what it
refused. Then each model's 16x8 file
against its int8 one: SQNR of the rebuilt integer path against the float file
in LiteRT, and the bytes of the QGraph's integer arrays (int16 activations
need int64 biases, so 16x8 stores a little more; a 16x8 softmax adds its two
513-entry tables). A 16x8 model ending in softmax gets TFLite's int16 softmax,
whose interpolated exp table bounds its SQNR: LiteRT running the 16x8 file
itself gives the DS-CNN the same figure.

With --tflm DIR (a folder of the tflite-micro, CMSIS-NN, CMSIS_6, flatbuffers, gemmlowp and ruy checkouts;
bench/tflm_peer.py says which commits and how to fetch them), the last table is measured on a Cortex-M4
(mps2-an386) in qemu 7.2: each int8 file rebuilt as given and exported by the c target with `rounding: tflm`
(-O2), against TFLM with CMSIS-NN kernels (built here, default double rounding: TFLM's) running the file
itself: instructions per inference (goal <= 0.8x TFLM+CMSIS-NN's), output bytes that differ over the samples
(goal 0), and the arena TFLM used in qemu. Without it that table says it was not measured. The 16x8 files are
not in it: TFLM's CMSIS-NN FULLY_CONNECTED refuses per-channel weights under int16 input in Prepare
(tensorflow/lite/micro/kernels/cmsis_nn/fully_connected.cc:116 at the pinned commit, seen with a build that keeps
TFLM's error strings), so TFLM+CMSIS-NN cannot run them; their C equals TFLM's reference-kernel interpreter
(the first table, and tests/targets/c/test_c_16x8.py in qemu).

Usage: python bench/tflite.py [--samples N] [--tflm DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from tflite_runtime import MODELS, given_qgraph, imported, inputs_for, model, run_litert, run_tflm  # noqa: E402

from dabuild.errors import UsageError  # noqa: E402
from dabuild.qir.qgraph import QGraph  # noqa: E402
from dabuild.qir.reference import dequantize_output, quantize_input, run_integer  # noqa: E402
from dabuild.targets.base import Target  # noqa: E402
from dabuild.targets.c import CTarget  # noqa: E402
from dabuild.targets.c.codegen import stored_bytes  # noqa: E402
from dabuild.targets.c.profiles import PROFILES  # noqa: E402
from dabuild.targets.tflite import MODEL_FILE, TfliteTarget  # noqa: E402
from dabuild.targets.tflite.runtime import arena_bytes  # noqa: E402
from dabuild.targets.tflite.runtime import run_tflm as run_file  # noqa: E402

sys.path.insert(0, str(REPO / "bench"))
from tflm_peer import Checkouts, PeerMissing, measure  # noqa: E402

GOAL = 0.8   # c's instructions against TFLM+CMSIS-NN's on a Cortex-M4


def tflm_arena(path: Path) -> int:
    """The arena total TFLM's RecordingMicroAllocator reports after an invoke on zeros (-1: none)."""
    from tflite_micro.python.tflite_micro import runtime

    details = runtime.Interpreter.from_file(str(path)).get_input_details(0)
    found = arena_bytes(path, np.zeros(details["shape"][1:], details["dtype"]))
    return -1 if found is None else found


def tflite_target_row(path: Path, qgraph: QGraph, x: np.ndarray, expected: np.ndarray) -> str:
    """The tflite target's file for the rebuilt QGraph: its bytes, the original's, output bytes differing from
    the original's in TFLM, and TFLM's arena for it; or what the target refused."""
    target = TfliteTarget(TfliteTarget.Options(litert=False))
    with tempfile.TemporaryDirectory(prefix="dabuild-bench-tflite-") as work:
        try:
            target.export(target.integer_graph(qgraph), Path(work))
        except UsageError as error:
            refused = sorted({line.split("(")[1].split(")")[0] for line in str(error).splitlines()[1:] if "(" in line})
            return f"{path.stem:<26} refused: layers of {', '.join(refused)}"
        written = Path(work) / MODEL_FILE
        ours = run_file(written, quantize_input(qgraph, x))
        differing = int(np.sum(ours.reshape(expected.shape) != expected))
        return (f"{path.stem:<26} {written.stat().st_size:>8} {path.stat().st_size:>8} "
                f"{written.stat().st_size / path.stat().st_size:>6.2f} {f'{differing}/{expected.size}':>14} "
                f"{tflm_arena(written):>12}")


def sqnr_db(signal: np.ndarray, approximation: np.ndarray) -> float:
    noise = np.sum((signal - approximation) ** 2)
    return float(10 * np.log10(np.sum(signal**2) / noise)) if noise > 0 else float("inf")


def qemu_row(path: Path, checkouts: Checkouts, samples: int) -> str:
    """The c target with rounding tflm against TFLM+CMSIS-NN on the file, both on a Cortex-M4 in qemu."""
    _, qgraph = given_qgraph(path)
    x_q = quantize_input(qgraph, inputs_for(path, samples, seed=11))
    target = CTarget(CTarget.Options(cpu="cortex-m4", rounding="tflm"))
    with tempfile.TemporaryDirectory(prefix="dabuild-bench-tflite-qemu-") as work:
        artifact, run, count = (Path(work) / name for name in ("artifact", "run", "count"))
        for folder in (artifact, run, count):
            folder.mkdir()
        target.export(target.integer_graph(qgraph), artifact)
        ours = target.run(artifact, x_q, run)
        instructions = target.measurements(artifact, x_q[:1], count)["firmware"]["instructions_per_inference"]
        peer = measure(path, qgraph, x_q, target.profile, checkouts, artifact, Path(work) / "tflm")
    assert peer.instructions is not None
    differing = int(np.sum(ours.reshape(peer.outputs.shape) != peer.outputs))
    return (f"{path.stem:<26} {instructions:>13,} {peer.instructions:>15,} {instructions / peer.instructions:>6.2f}x "
            f"{f'{differing}/{peer.outputs.size}':>14} {peer.arena_bytes:>12,}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--tflm", type=Path, metavar="DIR", default=None,
                        help="the peer checkouts' folder: measure TFLM+CMSIS-NN against the c target in qemu")
    args = parser.parse_args()
    try:
        checkouts = Checkouts(args.tflm) if args.tflm else None
    except PeerMissing as missing:
        parser.error(str(missing))
    m4 = PROFILES["cortex-m4"]
    print(f"{'model':<26} {'import ms':>9} {'file B':>7} {'C stores B':>10} {'differ (dabuild)':>16} "
          f"{'differ (tflm)':>13} {'TFLM arena B':>12}")
    written = []
    for path in MODELS:
        start = time.perf_counter()
        imported(path)
        import_ms = 1000 * (time.perf_counter() - start)
        row = f"{path.stem:<26} {import_ms:>9.1f} {path.stat().st_size:>7}"
        if path.stem.endswith("_float"):
            print(row)
            continue
        _, qgraph = given_qgraph(path)
        x = inputs_for(path, args.samples, seed=11)
        expected = run_tflm(path, qgraph, x)["output"]
        arena = tflm_arena(path)
        counts = []
        for rounding in ("dabuild", "tflm"):
            ours = run_integer(CTarget(CTarget.Options(rounding=rounding)).integer_graph(qgraph),
                               quantize_input(qgraph, x))
            counts.append(f"{int(np.sum(ours.reshape(expected.shape) != expected))}/{expected.size}")
        c_bytes = stored_bytes(qgraph, m4)
        print(f"{row} {c_bytes:>10} {counts[0]:>16} {counts[1]:>13} {arena:>12}")
        written.append(tflite_target_row(path, qgraph, x, expected))
    print()
    print(f"{'tflite target':<26} {'ours B':>8} {'file B':>8} {'ratio':>6} {'differ (TFLM)':>14} {'TFLM arena B':>12}")
    print("\n".join(written))
    print()
    print(f"{'model':<14} {'int8 SQNR dB':>12} {'16x8 SQNR dB':>12} {'int8 B':>9} {'16x8 B':>9}")
    for stem in sorted({path.stem.rsplit('_', 1)[0] for path in MODELS}):
        if not model(f"{stem}_16x8").exists():
            continue
        x = inputs_for(model(f"{stem}_float"), args.samples, seed=11)
        reference = run_litert(model(f"{stem}_float"), x)
        figures = []
        for variant in ("int8", "16x8"):
            _, qgraph = given_qgraph(model(f"{stem}_{variant}"))
            ours = dequantize_output(qgraph, run_integer(qgraph, quantize_input(qgraph, x)))
            figures.append((sqnr_db(reference, ours.reshape(reference.shape)), Target().stored_bytes(qgraph)))
        print(f"{stem:<14} {figures[0][0]:>12.1f} {figures[1][0]:>12.1f} {figures[0][1]:>9} {figures[1][1]:>9}")
    print()
    if checkouts is None:
        print("c (rounding tflm) against TFLM+CMSIS-NN on a Cortex-M4 in qemu: not measured (give --tflm DIR, "
              "see bench/tflm_peer.py)")
        return
    print(f"Cortex-M4 in qemu 7.2, -O2, {args.samples} samples; c with rounding tflm, TFLM+CMSIS-NN double rounding")
    print(f"{'model':<26} {'c instructions':>13} {'TFLM+CMSIS-NN':>15} {'ratio':>7} {'differ (goal 0)':>14} "
          f"{'TFLM arena B':>12}   (ratio goal <= {GOAL}x)")
    for path in MODELS:
        if path.stem.endswith("_int8"):
            print(qemu_row(path, checkouts, args.samples), flush=True)


if __name__ == "__main__":
    main()
