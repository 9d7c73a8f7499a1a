"""check:<target>: run the artifact in its real runtime and compare with dabuild's reference.

The reference is the one the target names (`Target.reference`):

- "integer": `run_integer` on the quantized inputs; the artifact gets the same
  int8 inputs, so an integer target must agree bit for bit at `exact`.
- "fake_quant": `run_quantized` (quantize the float input, run the integer
  path, dequantize the output); the artifact gets the float inputs and
  quantizes them itself, and outputs are compared in float, where
  `approximate` allows one output quantization step.

A fake-quant runtime (onnxruntime, tract) requantizes in float32 and rounds
ties to even, so about 4 in a million of a layer's values land one step from
the reference's fixed point, each within ~3e-5 of a .5 boundary; a deep
residual net carries such flips on, and its outputs can drift past one step
with no layer in error. Where the outputs of some samples disagree, the check
therefore proves those samples layer by layer (`layer_by_layer`): every layer
of the artifact, fed the runtime's own values of its inputs (its per-layer
trace), must agree with the reference layer at the same tolerance. That
catches every wrong weight, scale, zero point or op where it is, and the
report says which proof passed and how far the outputs drifted.

On disagreement a debug bundle holds everything needed to reproduce and
locate it: inputs, expected and actual outputs, per-layer traces of the
reference and (where the runtime shows them) of the artifact, the artifact,
versions, and a run.sh that reruns the artifact and repeats the comparison.
The error names the bundle and the first layer, in schedule order, whose
output differs beyond the same tolerance.
"""

from __future__ import annotations

import hashlib
import json
import platform
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

import dabuild
from dabuild.errors import CheckError
from dabuild.notices import warn
from dabuild.progress import Progress
from dabuild.qir.qgraph import QGraph, QuantParams
from dabuild.qir.reference import dequantize_output, quantize_input, run_integer
from dabuild.targets.base import Target
from dabuild.targets.tolerance import LEVELS, Comparison, compare, outside

REPORT_FILE = "report.json"
REFERENCES = {"integer": "integer reference", "fake_quant": "fake-quant reference"}
TRACE_SAMPLES = 64  # samples traced layer by layer, from the first one that fails
PROOF_SAMPLES = 2   # samples per traced run of the layer-by-layer proof: it holds every tensor of them 3 times


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n")  # strict JSON


def _versions(target: Target) -> dict[str, str]:
    return {"dabuild": dabuild.__version__, "python": platform.python_version(),
            "numpy": np.__version__, **target.runtime_version()}


def reference_inputs(reference: str, qgraph: QGraph, x: np.ndarray) -> np.ndarray:
    """What the artifact's `run` takes: the quantized inputs for integer targets, else the float ones (int64
    token ids for a graph whose input indexes an embedding table)."""
    if reference == "integer":
        return quantize_input(qgraph, x)
    return np.asarray(x, dtype=np.int64 if qgraph.takes_indices else np.float32)


REFERENCE_BATCH = 32  # samples the reference runs at once: a ResNet-50's live integer tensors take ~5 MB each


def reference_outputs(reference: str, qgraph: QGraph, inputs: np.ndarray) -> np.ndarray:
    """dabuild's outputs for `inputs` (as `reference_inputs` made them), in the form the artifact returns, run
    REFERENCE_BATCH samples at a time when every layer is integer (exact, so the batches change no bit; a
    float island's BLAS might round by batch size, so such a graph runs whole)."""
    def run(part: np.ndarray) -> np.ndarray:
        if reference == "integer":
            return run_integer(qgraph, part)
        return dequantize_output(qgraph, run_integer(qgraph, quantize_input(qgraph, part)))

    return in_batches(run, inputs, None if qgraph.has_float_islands else REFERENCE_BATCH)


def in_batches(run: Callable[[np.ndarray], np.ndarray], inputs: np.ndarray, batch: int | None,
               done: Callable[[int], None] = lambda count: None) -> np.ndarray:
    """`run` over `inputs` `batch` samples at a time (None: all at once; one run, of none, if there are none),
    its outputs concatenated; `done` hears how many samples each run took."""
    step = batch or max(len(inputs), 1)
    parts = []
    for low in range(0, max(len(inputs), 1), step):
        parts.append(np.asarray(run(inputs[low:low + step])))
        done(len(parts[-1]))
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def real(values: np.ndarray, params: QuantParams) -> np.ndarray:
    """Real values in float64: integers are dequantized with `params` (one step is one scale up to 1e-16)."""
    values = np.asarray(values)
    if np.issubdtype(values.dtype, np.integer):
        return (values.astype(np.float64) - params.zero_point) * params.scale
    return values.astype(np.float64)


def _compare(expected: np.ndarray, actual: np.ndarray, params: QuantParams, level: str) -> Comparison:
    return compare(real(expected, params), real(actual, params), level, scale=params.scale)


def integers(values: np.ndarray, params: QuantParams) -> np.ndarray:
    """A traced tensor as its integers: a runtime that shows real values shows (q - zero point) * scale
    (a value that is not finite, which no integer is, saturates; NaN to the bottom)."""
    values = np.asarray(values)
    if not np.issubdtype(values.dtype, np.integer):
        values = np.nan_to_num(np.rint(values.astype(np.float64) / params.scale) + params.zero_point,
                               nan=params.qmin, posinf=params.qmax, neginf=params.qmin)
    return params.saturate(values)


def _compare_differing(expected: np.ndarray, actual: np.ndarray, params: QuantParams,
                       level: str) -> tuple[bool, int, float]:
    """`_compare`'s verdict, mismatches and max abs error, computed on the elements that differ when both sides
    are integers: equal integers are equal real values, an error of exactly 0, so the rest decide alone (a
    layer's traced integers agree with the reference's almost everywhere, and comparing every value in
    float64 took most of the proof's time)."""
    expected, actual = np.asarray(expected), np.asarray(actual)
    integral = np.issubdtype(expected.dtype, np.integer) and np.issubdtype(actual.dtype, np.integer)
    if not integral or expected.shape != actual.shape:
        comparison = _compare(expected, actual, params, level)
        return comparison.ok, comparison.mismatches, comparison.max_abs_err
    differ = expected != actual
    if not differ.any():
        return True, 0, 0.0
    comparison = _compare(expected[differ], actual[differ], params, level)
    return comparison.mismatches / expected.size <= LEVELS[level].outliers, comparison.mismatches, comparison.max_abs_err


def layer_by_layer(target: Target, qgraph: QGraph, artifact_dir: Path, inputs: np.ndarray,
                   level: str) -> dict[str, Any] | None:
    """Each layer of the artifact against the reference layer fed the runtime's own values (None: the target
    shows no layers).

    `inputs` (float samples) run in the target's per-layer trace, PROOF_SAMPLES at a time, the next traced on
    a thread of its own while the reference's layers run on the last (a runtime checked at one thread leaves
    the other cores to them); each layer of the
    QGraph then runs on the traced integers of its inputs (the reference's own values where the runtime
    shows none) and its outputs are compared with the traced ones at `level`; so is the runtime's quantized
    input with the reference's. The trace shows the model's output as the runtime returns it, so its
    dequantization is proven too. The result says whether every step agrees, the first that does not (with
    how far), and the largest disagreement of any.
    """
    worst: tuple[float, str] = (0.0, "")
    failure: str | None = None
    compared: set[str] = set()
    starts = range(0, len(inputs), PROOF_SAMPLES)
    with (tempfile.TemporaryDirectory(prefix="dabuild-proof-") as work,
          ThreadPoolExecutor(1, thread_name_prefix="dabuild-proof-trace") as tracer):
        def trace(start: int) -> dict[str, np.ndarray] | None:
            return target.trace(Path(artifact_dir), inputs[start:start + PROOF_SAMPLES], Path(work))

        upcoming = tracer.submit(trace, starts[0]) if starts else None
        for index, start in enumerate(starts):
            samples = inputs[start:start + PROOF_SAMPLES]
            assert upcoming is not None
            traced = upcoming.result()
            # the runtime traces the next samples while this thread runs the reference's layers on these
            upcoming = tracer.submit(trace, starts[index + 1]) if index + 1 < len(starts) else None
            if traced is None:
                return None
            runtime = {name: value for name, value in traced.items()
                       if name in qgraph.tensors and name not in qgraph.constants}
            fed = {name: integers(value, qgraph.tensors[name].params) for name, value in runtime.items()}
            values: dict[str, np.ndarray] = {**qgraph.constants, qgraph.input: quantize_input(qgraph, samples)}
            steps = [("graph input", qgraph.input, values[qgraph.input])]  # the runtime's own quantization
            for layer in qgraph.layers:
                outputs = layer.run([fed.get(name, values[name]) for name in layer.inputs], qgraph, None)
                values.update(zip(layer.outputs, outputs))
                steps += [(f"layer {layer.name!r}", name, value) for name, value in zip(layer.outputs, outputs)]
            for where, name, expected in steps:
                if name not in runtime:
                    continue
                params = qgraph.tensors[name].params
                ok, mismatches, max_abs_err = _compare_differing(expected, runtime[name], params, level)
                compared.add(where)
                off = max_abs_err / params.scale if np.isfinite(max_abs_err) else np.inf
                worst = max(worst, (off, where))
                if not ok and failure is None:
                    failure = (f"{where} (tensor {name!r}): {mismatches} of {expected.size} values of "
                               f"samples {start}..{start + len(samples) - 1} outside {level!r} given the runtime's "
                               f"own inputs, up to {off:g} steps")
    return {"ok": failure is None, "samples": len(inputs), "layers": len(compared),
            "max_steps": round(worst[0], 6) if np.isfinite(worst[0]) else None, "worst": worst[1] or None,
            "first_failure": failure}


def first_divergence(qgraph: QGraph, expected: dict[str, np.ndarray], actual: dict[str, np.ndarray],
                     level: str) -> str | None:
    """The first tensor, in schedule order, whose traced values differ beyond `level`, described; None if none."""
    steps = [("graph input", qgraph.input)] + [(f"layer {layer.name!r}", name) for layer in qgraph.layers
                                                for name in layer.outputs]
    for where, tensor in steps:
        if tensor not in expected or tensor not in actual:
            continue
        if np.shape(expected[tensor]) != np.shape(actual[tensor]):
            return (f"{where} (tensor {tensor!r}): shape {np.shape(actual[tensor])} where the reference has "
                    f"{np.shape(expected[tensor])}")
        if tensor in qgraph.floats:  # a float island's tensor: its float32 bits, whatever the level
            differing = int(np.sum(np.asarray(expected[tensor]) != np.asarray(actual[tensor])))
            if differing:
                return f"{where} (float tensor {tensor!r}): {differing} of {np.size(expected[tensor])} values differ"
            continue
        params = qgraph.tensors[tensor].params
        comparison = _compare(expected[tensor], actual[tensor], params, level)
        if not comparison.ok:
            return (f"{where} (tensor {tensor!r}): {comparison.mismatches} of {np.size(expected[tensor])} values "
                    f"outside {level!r}, max error {comparison.max_abs_err / params.scale:g} steps")
    return None


def _run_script(target: Target, bundle: Path, level: str) -> None:
    """run.sh: rerun the bundled artifact on inputs.bin and compare with expected.bin as the check did."""
    if level == "exact":  # bytes equal: needs nothing but the runtime
        compare_line = "cmp expected.bin rerun.bin && echo 'outputs match the reference'\n"
    else:
        compare_line = '"${PYTHON:-python3}" -m dabuild.targets.check . rerun.bin\n'
    script = bundle / "run.sh"
    script.write_text("#!/bin/sh\n"
                      f"# Rerun the artifact on inputs.bin and compare with dabuild's reference at {level!r}.\n"
                      "set -e\ncd \"$(dirname \"$0\")\"\n"
                      + target.rerun_script(bundle / "artifact", "inputs.bin", "rerun.bin")
                      + compare_line)
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def write_bundle(target: Target, qgraph: QGraph, artifact_dir: Path, inputs: np.ndarray, expected: np.ndarray,
                 actual: np.ndarray, report: dict[str, Any], bundle_root: Path) -> tuple[Path, str]:
    """A self-contained folder that reproduces a failed check; its path and where the outputs first diverge.

    The per-layer traces cover TRACE_SAMPLES samples from the first failing one (`trace_samples` in
    report.json gives the range).
    """
    digest = hashlib.sha256(inputs.tobytes() + actual.tobytes()).hexdigest()[:12]
    bundle = Path(bundle_root) / f"{target.kind}-mismatch-{digest}"
    if bundle.exists():
        shutil.rmtree(bundle)
    bundle.mkdir(parents=True)
    for name, array in (("inputs", inputs), ("expected", expected), ("actual", actual)):
        np.save(bundle / f"{name}.npy", array)
        array.tofile(bundle / f"{name}.bin")
    start = report["first_mismatch"][0]
    samples = inputs[start:start + TRACE_SAMPLES]
    integer_samples = samples if target.reference == "integer" else quantize_input(qgraph, samples)
    reference_trace = run_integer(qgraph, integer_samples, keep_intermediates=True)
    np.savez(bundle / "reference_trace.npz", **reference_trace)  # type: ignore[arg-type]  # numpy's stub: any ** key could be allow_pickle
    with tempfile.TemporaryDirectory(prefix="dabuild-trace-") as work:
        target_trace = target.trace(Path(artifact_dir), samples, Path(work))
    if target_trace is None:
        divergence = f"target {target.kind!r} shows no per-layer values, so the diverging layer is unknown"
    else:
        np.savez(bundle / "target_trace.npz", **target_trace)  # type: ignore[arg-type]  # as above
        found = first_divergence(qgraph, reference_trace, target_trace, report["tolerance"])
        divergence = (f"first diverging {found}" if found else
                      "every traced layer agrees, so the outputs diverge past the last traced tensor")
    shutil.copytree(artifact_dir, bundle / "artifact")
    _write_json(bundle / "versions.json", _versions(target))
    _write_json(bundle / REPORT_FILE, {**report, "trace_samples": [start, start + len(samples)],
                                       "divergence": divergence})
    _run_script(target, bundle, report["tolerance"])
    return bundle, divergence


def _describe(comparison: Comparison, expected: np.ndarray, actual: np.ndarray) -> str:
    index = comparison.first_mismatch
    assert index is not None
    sample, position = index[0], index[1:]
    where = f"sample {sample}" + (f", output {position[0] if len(position) == 1 else position}" if position else "")
    return (f"first diverging output at {where} (expected {expected[index]}, got {actual[index]}); "
            f"{comparison.mismatches} of {expected.size} outputs outside tolerance "
            f"{comparison.level!r}, max abs error {comparison.max_abs_err:g}")


def check_stage(target: Target, qgraph: QGraph, artifact_dir: Path, x: np.ndarray, tolerance: str | None,
                out_dir: Path, bundle_root: Path, progress: Progress,
                score: Callable[[np.ndarray], float] | None = None) -> dict[str, Any]:
    """Compare the artifact with the target's reference on `x` (float samples); write out_dir/report.json.

    With `score` (the recipe's metric on `x`'s labels), the report also gives the metric of the artifact's
    own outputs in its runtime and of the reference's: the accuracy the artifact really delivers, which
    may differ from the tuned one where the runtime rounds differently (onnxruntime, tract)."""
    level = tolerance or target.default_tolerance
    if level not in LEVELS:
        raise CheckError(f"unknown tolerance {level!r}; levels: {', '.join(LEVELS)}")
    if target.reference not in REFERENCES:
        raise CheckError(f"target {target.kind!r} asks for a {target.reference!r} reference; check compares with "
                         f"{' or '.join(map(repr, REFERENCES))}")
    not_run = target.not_run()
    for part in not_run:
        warn(f"check {target.kind}: not run: {part}")
    inputs = reference_inputs(target.reference, qgraph, x)
    # the reference runs on a thread of its own meanwhile: the runtime's compile and its parts' uneven ends
    # leave cores idle that the reference's layers fill (both are deterministic: no bit depends on the overlap)
    with (tempfile.TemporaryDirectory(prefix="dabuild-check-") as work,
          ThreadPoolExecutor(1, thread_name_prefix="dabuild-check-reference") as reference,
          progress.track(f"check {target.kind}", len(inputs)) as advance):
        outputs = reference.submit(reference_outputs, target.reference, qgraph, inputs)
        actual = in_batches(lambda part: target.run(Path(artifact_dir), part, Path(work)), inputs, target.run_batch,
                            advance)
        expected = np.asarray(outputs.result())
    if actual.shape != expected.shape:
        raise CheckError(f"{target.kind} artifact {artifact_dir} returned outputs of shape {actual.shape}; "
                         f"the reference has {expected.shape}")
    params = qgraph.output_params
    comparison = _compare(expected, actual, params, level)
    report: dict[str, Any] = {
        "target": target.kind, "tolerance": level, "reference": target.reference, "samples": len(inputs),
        "output_params": {"scale": params.scale, "zero_point": params.zero_point, "dtype": params.dtype},
        **comparison.to_dict(), "proof": "end to end", "runtime": _versions(target), "not_run": not_run}
    if not comparison.ok and target.reference == "fake_quant":
        proof = _prove_disagreeing_samples(target, qgraph, Path(artifact_dir), inputs, expected, actual, params,
                                           level, progress)
        if proof is not None:
            report.update(ok=proof["ok"], proof="layer by layer", layer_by_layer=proof)
    if qgraph.has_float_islands:
        report["float_islands"] = {"layers": [layer.name for layer in qgraph.layers
                                              if getattr(layer, "computes_in_float", False)],
                                   "float_order": target.float_order}
    if score is not None:
        real = (lambda y: y) if target.reference == "fake_quant" else params.dequantize
        report["metric"] = {"artifact": score(real(actual)), "reference": score(real(expected))}
    if comparison.ok:
        with tempfile.TemporaryDirectory(prefix="dabuild-measure-") as work:
            report.update(target.measurements(Path(artifact_dir), inputs, Path(work)))
    _write_json(Path(out_dir) / REPORT_FILE, report)
    if not report["ok"]:
        bundle, divergence = write_bundle(target, qgraph, Path(artifact_dir), inputs, expected, actual, report,
                                          bundle_root)
        proven = report.get("layer_by_layer")
        own = f"; layer by layer, {proven['first_failure']}" if proven else ""
        raise CheckError(f"check {target.kind}: the artifact disagrees with dabuild's {REFERENCES[target.reference]}: "
                         f"{_describe(comparison, expected, actual)}{own}; {divergence}; debug bundle: {bundle}")
    unproven = f"; not run: {'; '.join(not_run)}" if not_run else ""
    how = level if comparison.ok else (f"{level} layer by layer on the runtime's own inputs; end to end up to "
                                       f"{comparison.max_abs_err / params.scale:.3g} steps of rounding drift")
    progress.info(f"check {target.kind}: {len(inputs)} samples agree ({how})"
                  + "".join(f"; {name} {value}" for name, value in sorted(report.get("firmware", {}).items()))
                  + unproven)
    return report


def _prove_disagreeing_samples(target: Target, qgraph: QGraph, artifact_dir: Path, inputs: np.ndarray,
                               expected: np.ndarray, actual: np.ndarray, params: QuantParams, level: str,
                               progress: Progress) -> dict[str, Any] | None:
    """`layer_by_layer` over the samples whose outputs disagree end to end (the others are proven already)."""
    bad = outside(real(expected, params), real(actual, params), level, scale=params.scale)
    failing = np.flatnonzero(bad.reshape(len(bad), -1).any(axis=1))
    with progress.track(f"check {target.kind} layer by layer", len(failing)) as advance:
        proof = layer_by_layer(target, qgraph, artifact_dir, inputs[failing], level)
        advance(len(failing))
    return proof


def recheck(bundle: Path, rerun_file: Path) -> Comparison:
    """Compare a rerun's raw outputs with a bundle's expected ones as its check did (what run.sh calls)."""
    report = json.loads((Path(bundle) / REPORT_FILE).read_text())
    expected = np.load(Path(bundle) / "expected.npy")
    actual = np.fromfile(rerun_file, dtype=expected.dtype).reshape(expected.shape)
    return _compare(expected, actual, QuantParams(**report["output_params"]), report["tolerance"])


def main(argv: list[str]) -> int:
    """`python -m dabuild.targets.check BUNDLE RERUN_FILE`: exit 0 when the rerun agrees, else 1."""
    bundle, rerun_file = (Path(arg) for arg in argv)
    comparison = recheck(bundle, rerun_file)
    if comparison.ok:
        print(f"outputs match the reference ({comparison.level})")
        return 0
    print(f"{comparison.mismatches} outputs outside tolerance {comparison.level!r}, first at "
          f"{list(comparison.first_mismatch or ())}, max abs error {comparison.max_abs_err:g}")
    return 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
