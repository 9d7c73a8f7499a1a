"""Full builds of real-size networks: ResNet-50 and MobileNetV2 at 224x224, c and onnx targets, both checks.

Each architecture (a family of tests/architectures.py at full size; random weights, non-trivial batch-norm statistics) is built as a
recipe by `dabuild build` in a child process (bench/big_model.py makes the recipe and runs it): 64 calibration
and 32 evaluation images (random normal pixels, labels the fp32 model's own top-1 classes), int8, strategy basic
with one trial by default (allow_miss: random weights have no accuracy to keep), targets c (checked `exact`
against the integer reference) and onnx (onnxruntime, checked `approximate`: one output step). Prints the
build's output as it comes, then per architecture each stage's time as the build reports it, the whole build's
wall time, and each check's verdict with its largest output error in quantization steps (and, where outputs
drifted past one step, the layer-by-layer proof of those samples).

Usage: python bench/full_build.py [--calibration 64] [--evaluation 32] [--trials 1] [-j 1] [ARCHITECTURE ...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from big_model import build, make_recipe

ARCHITECTURES = ("resnet", "mobilenet_v2")  # ResNet-50, MobileNetV2
TARGETS = {"c": "mcu", "onnx": "ort"}  # target kind -> the name big_model's recipe gives it


def check_line(build_dir: Path, kind: str) -> str:
    """A check's verdict, tolerance and largest error in output steps, from its report.json."""
    report_file = build_dir / f"check-{TARGETS[kind]}" / "report.json"
    if not report_file.exists():
        return f"check:{kind}: no report (the build stopped before it)"
    report = json.loads(report_file.read_text())
    error = report["max_abs_err"]  # null when not finite (strict JSON)
    steps = float("inf") if error is None else error / report["output_params"]["scale"]
    verdict = "passed" if report["ok"] else "FAILED"
    proof = report.get("layer_by_layer")  # the samples whose outputs drifted, proven on the runtime's own values
    layers = (f"; layer by layer on {proof['samples']} samples: at most {proof['max_steps']} steps "
              f"({proof['first_failure'] or 'every layer within tolerance'})" if proof else "")
    return (f"check:{kind}: {report['tolerance']} {verdict} on {report['samples']} samples, "
            f"max error {steps:.3g} output steps end to end, {report['mismatches']} outputs outside{layers}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("architectures", nargs="*", default=list(ARCHITECTURES),
                        help=f"family names in tests/architectures.py (default: {' '.join(ARCHITECTURES)})")
    parser.add_argument("--calibration", type=int, default=64)
    parser.add_argument("--evaluation", type=int, default=32)
    parser.add_argument("--trials", type=int, default=1)
    parser.add_argument("-j", "--jobs", type=int, default=1)
    parser.add_argument("--work", type=Path, help="folder for the recipes and builds (default: a temporary one)")
    args = parser.parse_args()
    failed = []
    with tempfile.TemporaryDirectory(prefix="dabuild-full-build-") as scratch:
        root = args.work or Path(scratch)
        for architecture in args.architectures:
            work = root / architecture
            work.mkdir(parents=True, exist_ok=True)
            make_recipe(work, args.calibration, args.evaluation, args.trials, architecture)
            print(f"{architecture}: 224x224, {args.calibration} calibration / {args.evaluation} evaluation images, "
                  f"int8, basic, max_trials {args.trials}, targets c and onnx, -j {args.jobs}, "
                  f"{os.cpu_count()} cores", flush=True)
            elapsed, stages, _ = build(work, work / "build", args.jobs, must_pass=False)
            build_dir = work / "build" / architecture.replace("_", "-")
            print(f"{architecture}:")
            for stage, seconds in stages.items():
                print(f"  {stage:<24} {seconds:8.1f} s")
            print(f"  {'whole build':<24} {elapsed:8.1f} s")
            for kind in TARGETS:
                line = check_line(build_dir, kind)
                print(f"  {line}", flush=True)
                if " passed " not in line:
                    failed.append(f"{architecture} {line}")
    if failed:
        raise SystemExit("failed: " + "; ".join(failed))


if __name__ == "__main__":
    main()
