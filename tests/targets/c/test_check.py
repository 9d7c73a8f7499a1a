"""Tolerance levels, check_stage reports against the real C target, and locating the first diverging layer."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from test_c_target import STRICT, export, random_mlp

from dabuild.errors import CheckError
from dabuild.progress import Progress
from dabuild.qir.reference import quantize_input, run_integer
from dabuild.targets.c import CTarget
from dabuild.targets.check import check_stage, first_divergence
from dabuild.targets.tolerance import LEVELS, compare


def test_levels_follow_the_design_table() -> None:
    assert list(LEVELS) == ["exact", "close", "approximate", "very", "super", "ultra"]
    assert (LEVELS["very"].atol, LEVELS["very"].rtol, LEVELS["very"].outliers) == (5e-2, 1e-2, 0.0)
    assert (LEVELS["ultra"].atol, LEVELS["ultra"].rtol, LEVELS["ultra"].outliers) == (0.2, 0.1, 5e-4)


def test_compare_reports_errors_and_the_first_mismatch() -> None:
    expected = np.zeros((3, 4))
    actual = expected.copy()
    actual[1, 2], actual[2, 0] = 0.5, -2.0
    result = compare(expected, actual, "exact")
    assert not result.ok and result.mismatches == 2 and result.first_mismatch == (1, 2)
    assert result.max_abs_err == 2.0 and result.outlier_fraction == pytest.approx(2 / 12)
    assert compare(expected, expected, "exact").ok
    assert compare(expected, expected + 1e-8, "close").ok and not compare(expected, expected + 1e-6, "close").ok


def test_approximate_allows_one_quantization_step() -> None:
    expected = np.linspace(-1, 1, 50)
    step = 0.01
    assert compare(expected, expected + step, "approximate", scale=step).ok
    assert not compare(expected, expected + 2.5 * step, "approximate", scale=step).ok
    assert not compare(expected, expected + step, "approximate").ok  # float outputs: atol 1e-4


def test_one_step_dequantized_in_float32_is_one_step() -> None:
    # A ResNet-50's QDQ output from onnxruntime: the reference's zero, the runtime's one step, both float32; the
    # scale rounded to float32 makes that step 1.0000001 of the float64 scale's.
    scale = 0.004370974793153651
    expected = np.zeros(4, np.float32)
    actual = (np.array([1, -1, 0, 1]) * np.float32(scale)).astype(np.float32)
    assert abs(float(actual[0])) > scale
    assert compare(expected, actual, "approximate", scale=scale).ok
    assert not compare(expected, actual * np.float32(1.0001), "approximate", scale=scale).ok
    assert not compare(expected, actual * 2, "approximate", scale=scale).ok


def test_super_tolerates_a_fraction_of_outliers() -> None:
    expected = np.zeros(20000)
    actual = expected.copy()
    actual[:2] = 1.0  # 1e-4 of the elements
    assert compare(expected, actual, "super").ok
    actual[:3] = 1.0
    assert not compare(expected, actual, "super").ok
    nan = np.array([np.nan, 1.0])
    assert compare(nan, nan, "exact").ok and not compare(nan, np.array([0.0, 1.0]), "exact").ok


@pytest.mark.parametrize("level", ["exact", "approximate", "ultra"])
def test_an_infinity_agrees_only_with_the_same_infinity(level: str) -> None:
    expected = np.array([np.inf, -np.inf, np.inf, 1.0, np.nan])
    assert compare(expected, expected.copy(), level, scale=0.1).ok
    for actual in ([0.0, -np.inf, np.inf, 1.0, np.nan], [np.inf, np.inf, np.inf, 1.0, np.nan],
                   [np.inf, -np.inf, 1e300, 1.0, np.nan], [np.inf, -np.inf, np.inf, np.inf, np.nan],
                   [np.inf, -np.inf, np.inf, 1.0, 1.0]):
        assert compare(expected, np.array(actual), level, scale=0.1).mismatches == 1, actual


def test_a_comparison_is_strict_json_even_when_errors_are_not_finite() -> None:
    report = compare(np.array([1.0, 0.0]), np.array([np.inf, 1.0]), "approximate", scale=0.1).to_dict()
    text = json.dumps(report, allow_nan=False)  # raises on Infinity or NaN
    assert json.loads(text)["max_abs_err"] is None and json.loads(text)["mismatches"] == 2


def test_check_stage_writes_a_passing_report(tmp_path: Path) -> None:
    qgraph = random_mlp()
    target = CTarget(CTarget.Options(cflags=STRICT))
    artifact = export(qgraph, tmp_path / "artifact", target)
    x = np.random.default_rng(21).normal(size=(120, 20)).astype(np.float32)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    report = check_stage(target, qgraph, artifact, x, None, out_dir, tmp_path / "debug", Progress.silent())
    assert report == json.loads((out_dir / "report.json").read_text())
    assert report["ok"] and report["tolerance"] == "exact" and report["samples"] == 120
    assert report["max_abs_err"] == 0.0 and report["mismatches"] == 0
    assert report["runtime"]["cc"] == target.runtime_version()["cc"]
    assert not (tmp_path / "debug").exists()


def test_off_by_one_step_fails_exact_but_passes_approximate(tmp_path: Path) -> None:
    qgraph = random_mlp()
    target = CTarget()
    artifact = export(qgraph, tmp_path / "artifact", target)
    # Raise fc3's first bias by floor(1 / multiplier) accumulator units: its output moves by 0 or 1 step.
    last = qgraph.layers[-1]
    real = last.multiplier[0] / 2.0 ** int(last.shift[0])
    header = artifact / "layer_fc3.h"
    text = header.read_text()
    match = re.search(r"_bias\[[^\]]*\] = \{\n\s*(-?\d+)", text)
    header.write_text(text[:match.start(1)] + str(int(match.group(1)) + int(1 / real)) + text[match.end(1):])
    x = np.random.default_rng(22).normal(size=(200, 20)).astype(np.float32)
    for name in ("exact", "approx"):
        (tmp_path / name).mkdir()
    with pytest.raises(CheckError, match="outside tolerance 'exact'"):
        check_stage(target, qgraph, artifact, x, "exact", tmp_path / "exact", tmp_path / "debug", Progress.silent())
    report = check_stage(target, qgraph, artifact, x, "approximate", tmp_path / "approx", tmp_path / "debug",
                         Progress.silent())
    assert report["ok"] and 0 < report["max_abs_err"] <= qgraph.output_params.scale * (1 + 1e-6)


def test_unknown_tolerance_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckError, match="unknown tolerance 'exactly'"):
        check_stage(CTarget(), random_mlp(), tmp_path, np.zeros((1, 20), np.float32), "exactly", tmp_path,
                    tmp_path, Progress.silent())


def test_first_divergence_names_the_first_layer_outside_tolerance() -> None:
    qgraph = random_mlp()
    x_q = quantize_input(qgraph, np.random.default_rng(23).normal(size=(30, 20)).astype(np.float32))
    reference = run_integer(qgraph, x_q, keep_intermediates=True)
    assert first_divergence(qgraph, reference, dict(reference), "exact") is None
    runtime = {name: reference[name].copy() for name in ("x", "h2", "h3")}  # a runtime showing some tensors
    runtime["h2"][3, 5] += 1  # one step at fc2 ...
    runtime["h3"] = runtime["h3"].astype(np.int64) + 4  # ... and four at fc3 (the output)
    assert first_divergence(qgraph, reference, runtime, "exact").startswith("layer 'fc2' (tensor 'h2'): 1 of")
    assert first_divergence(qgraph, reference, runtime, "approximate").startswith("layer 'fc3' (tensor 'h3')")
    real_values = {"h3": qgraph.tensors["h3"].params.dequantize(reference["h3"])}  # float traces are real values
    assert first_divergence(qgraph, reference, real_values, "close") is None


def test_a_reference_check_does_not_know_is_refused(tmp_path: Path) -> None:
    class FloatTarget(CTarget):
        reference = "float"

    with pytest.raises(CheckError, match=r"asks for a 'float' reference"):
        check_stage(FloatTarget(), random_mlp(), tmp_path, np.zeros((1, 20), np.float32), None, tmp_path, tmp_path,
                    Progress.silent())


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_the_proof_compares_integers_where_they_differ_as_a_full_comparison_would(level: str) -> None:
    """Equal integers are an error of exactly 0, so comparing only the differing ones gives the same verdict,
    mismatch count and largest error as comparing all."""
    from dabuild.qir.qgraph import QuantParams
    from dabuild.targets.check import _compare, _compare_differing

    rng = np.random.default_rng(3)
    params = QuantParams(0.0173, 5)
    expected = rng.integers(-128, 128, (4, 3, 50, 50)).astype(np.int8)
    for changed in (0, 1, 3, 40, 2000):
        actual = expected.copy()
        where = rng.choice(actual.size, changed, replace=False)
        actual.flat[where] = np.clip(actual.flat[where].astype(int) + rng.choice([-2, -1, 1, 2], changed), -128, 127)
        full = _compare(expected, actual, params, level)
        assert _compare_differing(expected, actual, params, level) == (full.ok, full.mismatches, full.max_abs_err)
