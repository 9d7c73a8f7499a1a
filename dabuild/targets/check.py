"""check:<target>: run the artifact in its real runtime and compare with dabuild's integer reference.

Both sides get the same quantized inputs, so an integer target must agree bit
for bit at the default `exact` level. On disagreement a debug bundle holds
everything needed to reproduce it without dabuild: inputs, expected and actual
outputs, the per-layer reference trace, the artifact and a run.sh.
"""

from __future__ import annotations

import hashlib
import json
import platform
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

import dabuild
from dabuild.errors import CheckError
from dabuild.progress import Progress
from dabuild.quant.qgraph import QGraph
from dabuild.quant.reference import quantize_input, run_integer
from dabuild.targets.base import Target
from dabuild.targets.tolerance import LEVELS, Comparison, compare

REPORT_FILE = "report.json"


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _versions(target: Target) -> dict[str, str]:
    return {"dabuild": dabuild.__version__, "python": platform.python_version(),
            "numpy": np.__version__, **target.runtime_version()}


def write_bundle(target: Target, qgraph: QGraph, artifact_dir: Path, x_q: np.ndarray, expected: np.ndarray,
                 actual: np.ndarray, report: dict[str, Any], bundle_root: Path) -> Path:
    """A self-contained folder that reproduces a failed check; returns its path."""
    digest = hashlib.sha256(x_q.tobytes() + actual.tobytes()).hexdigest()[:12]
    bundle = Path(bundle_root) / f"{target.kind}-mismatch-{digest}"
    if bundle.exists():
        shutil.rmtree(bundle)
    bundle.mkdir(parents=True)
    np.save(bundle / "inputs.npy", x_q)
    np.save(bundle / "expected.npy", expected)
    np.save(bundle / "actual.npy", actual)
    x_q.tofile(bundle / "inputs.bin")
    expected.tofile(bundle / "expected.bin")
    trace = run_integer(qgraph, x_q, keep_intermediates=True)
    np.savez(bundle / "reference_trace.npz", **trace)
    shutil.copytree(artifact_dir, bundle / "artifact")
    _write_json(bundle / "versions.json", _versions(target))
    _write_json(bundle / REPORT_FILE, report)
    script = bundle / "run.sh"
    script.write_text("#!/bin/sh\n"
                      "# Rebuild the artifact, run it on inputs.bin and compare with dabuild's reference.\n"
                      "set -e\ncd \"$(dirname \"$0\")\"\n"
                      + target.rerun_script(bundle / "artifact", "inputs.bin", "rerun.bin")
                      + "cmp expected.bin rerun.bin && echo 'outputs match the reference'\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return bundle


def _describe(comparison: Comparison, expected: np.ndarray, actual: np.ndarray) -> str:
    index = comparison.first_mismatch
    assert index is not None
    sample, position = index[0], index[1:]
    where = f"sample {sample}" + (f", output {position[0] if len(position) == 1 else position}" if position else "")
    return (f"first diverging output at {where} (expected {expected[index]}, got {actual[index]}); "
            f"{comparison.mismatches} of {expected.size} outputs outside tolerance "
            f"{comparison.level!r}, max abs error {comparison.max_abs_err:g}")


def check_stage(target: Target, qgraph: QGraph, artifact_dir: Path, x: np.ndarray, tolerance: str | None,
                out_dir: Path, bundle_root: Path, progress: Progress) -> dict[str, Any]:
    """Compare the artifact with run_integer on `x` (float samples); write out_dir/report.json."""
    level = tolerance or target.default_tolerance
    if level not in LEVELS:
        raise CheckError(f"unknown tolerance {level!r}; levels: {', '.join(LEVELS)}")
    x_q = quantize_input(qgraph, x)
    with tempfile.TemporaryDirectory(prefix="dabuild-check-") as work:
        with progress.track(f"check {target.kind}", len(x_q)) as advance:
            actual = np.asarray(target.run(Path(artifact_dir), x_q, Path(work)))
            advance(len(x_q))
    expected = np.asarray(run_integer(qgraph, x_q))
    if actual.shape != expected.shape:
        raise CheckError(f"{target.kind} artifact {artifact_dir} returned outputs of shape {actual.shape}; "
                         f"the reference has {expected.shape}")
    params = qgraph.output_params

    def dequantize(q: np.ndarray) -> np.ndarray:  # float64, so one step is one scale up to 1e-16
        return (q.astype(np.float64) - params.zero_point) * params.scale

    comparison = compare(dequantize(expected), dequantize(actual), level, scale=params.scale)
    report = {"target": target.kind, "tolerance": level, "samples": int(len(x_q)),
              **comparison.to_dict(), "runtime": _versions(target)}
    _write_json(Path(out_dir) / REPORT_FILE, report)
    if not comparison.ok:
        bundle = write_bundle(target, qgraph, Path(artifact_dir), x_q, expected, actual, report, bundle_root)
        raise CheckError(f"check {target.kind}: the artifact disagrees with dabuild's integer reference: "
                         f"{_describe(comparison, expected, actual)}; debug bundle: {bundle}")
    progress.info(f"check {target.kind}: {len(x_q)} samples agree ({level})")
    return report
