"""Classic architectures at their published size: trace time, fp32 speed against onnxruntime, memory, agreement.

Each family of tests/architectures.py is built at full size with random weights, exported by torch.onnx with
the batch fixed to 1 at opset 17 (as published files have it) in one child process, and measured in another
that imports no torch, so its peak RSS counts what dabuild holds (a child inherits its parent's peak, so the
parent loads nothing either): reading and converting the file (trace_model + optimize),
then one 224x224 image through the interpreter (1 thread), then the same file in onnxruntime (1 thread, all
graph optimisations) on the same image. Times are the fastest of the calls within a short window
(bench/timing.py); the speed column is dabuild's images per second over onnxruntime's, from this run.
Families the frontend cannot trace yet say which ops they need.

Usage: python bench/models.py [--seconds S] [FAMILY ...]
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent / "tests"))  # the families live beside the tests that build them small
sys.path.insert(0, str(BENCH))

SIDE = 224
HEADER = ("model", "nodes", "trace s", "dabuild ms/img", "onnxruntime ms/img", "speed vs ort", "peak RSS GB",
          "max rel err")


def export(name: str, path: Path) -> None:
    import torch
    from architectures import FAMILIES, build

    family = next(family for family in FAMILIES if family.name == name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(build(family, full=True), torch.zeros(1, 3, SIDE, SIDE), str(path), opset_version=17,
                          dynamo=False)


def measure(path: Path, seconds: float) -> dict[str, object]:
    """One model, in this (fresh) process: the row's figures."""
    import numpy as np
    import onnxruntime as ort
    from timing import fastest

    from dabuild.errors import UsageError
    from dabuild.ir.interpreter import Interpreter
    from dabuild.ir.passes import optimize
    from dabuild.trace import trace_model

    start = time.perf_counter()
    try:
        graph = optimize(trace_model(path))
    except UsageError as error:  # the nodes it lists, by op
        ops = sorted(set(re.findall(r"^\s+node '.*' \(([^)]+)\): ", str(error), re.MULTILINE)))
        return {"error": f"needs {', '.join(ops)}" if ops else str(error).splitlines()[0]}
    trace_seconds = time.perf_counter() - start
    image = np.random.default_rng(0).normal(size=(1, 3, SIDE, SIDE)).astype(np.float32)
    interpreter = Interpreter(graph, threads=1)
    feeds = {graph.inputs[0].name: image}
    ours = interpreter.run(feeds)[graph.outputs[0]]
    dabuild_seconds = fastest(lambda: interpreter.run(feeds), seconds)
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # kB on Linux; before onnxruntime loads
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    ort_feeds = {session.get_inputs()[0].name: image}
    theirs = session.run(None, ort_feeds)[0]
    ort_seconds = fastest(lambda: session.run(None, ort_feeds), seconds)
    error = float(np.max(np.abs(ours - theirs)) / max(float(np.max(np.abs(theirs))), 1e-12))
    return {"nodes": len(graph.nodes), "trace": trace_seconds, "dabuild": dabuild_seconds, "ort": ort_seconds,
            "peak_gb": peak_gb, "error": error}


def row(name: str, result: dict[str, object]) -> list[str]:
    if isinstance(result.get("error"), str):
        return [name, "—", "not traced: " + str(result["error"]), "", "", "", "", ""]
    ours, theirs = float(result["dabuild"]), float(result["ort"])  # type: ignore[arg-type]
    return [name, str(result["nodes"]), f"{result['trace']:.2f}", f"{ours * 1e3:.0f}", f"{theirs * 1e3:.0f}",
            f"{theirs / ours:.2f}x", f"{result['peak_gb']:.2f}", f"{result['error']:.1e}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("families", nargs="*", help="names from tests/architectures.py (default: all)")
    parser.add_argument("--seconds", type=float, default=3.0, help="timing window per runtime and model")
    parser.add_argument("--one", type=Path, help=argparse.SUPPRESS)  # child: measure this file, print JSON
    parser.add_argument("--export", nargs=2, help=argparse.SUPPRESS)  # child: export FAMILY to PATH
    parser.add_argument("--list", action="store_true", help=argparse.SUPPRESS)  # child: the family names
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.seconds)))
        return
    if args.export:
        export(args.export[0], Path(args.export[1]))
        return
    if args.list:
        from architectures import FAMILIES

        print(json.dumps([family.name for family in FAMILIES]))
        return
    names = args.families or json.loads(subprocess.run([sys.executable, __file__, "--list"], check=True,
                                                       capture_output=True, text=True).stdout)
    rows = []
    with tempfile.TemporaryDirectory(prefix="dabuild-bench-models-") as folder:
        for name in names:
            path = Path(folder) / f"{name}.onnx"
            # Children inherit the parent's peak RSS, so this process never loads torch or a model itself.
            subprocess.run([sys.executable, __file__, "--export", name, str(path)], check=True)
            child = subprocess.run([sys.executable, __file__, "--one", str(path), "--seconds", str(args.seconds)],
                                   check=False, capture_output=True, text=True)
            if child.returncode != 0:
                result = {"error": (child.stderr.strip().splitlines() or ["crashed"])[-1]}
            else:
                result = json.loads(child.stdout.strip().splitlines()[-1])
            rows.append(row(name, result))
            print(f"{name}: done", file=sys.stderr, flush=True)
    print(f"Classic architectures at {SIDE}x{SIDE}, random weights, batch fixed to 1 in the file (opset 17); "
          "1 thread each; speed = onnxruntime time / dabuild time")
    print("| " + " | ".join(HEADER) + " |")
    print("|" + " --- |" * len(HEADER))
    for cells in rows:
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
