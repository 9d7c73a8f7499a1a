"""The tolerance levels of check_io (named as tract names them) and the comparison behind them.

An element is an outlier when |actual - expected| > atol + rtol * |expected|;
a level passes when the fraction of outliers is at most its `outliers`.
For quantized outputs "approximate" allows one quantization step instead of 1e-4, as the runtime states it:
a step dequantized in float32 (the scale rounded to float32, the product rounded again) is up to 2^-23 of
a step more than the float64 scale, so a value one step from a reference zero would fail by that much.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FLOAT32_ROUNDING = 2.0**-24    # relative error of one float32 rounding
FLOAT32_STEP_SLACK = 2.0**-22  # a dequantized step in float32: its scale rounded, then the product (2^-23), and more


@dataclass(frozen=True)
class Level:
    name: str
    atol: float
    rtol: float
    outliers: float       # tolerated fraction of elements outside atol + rtol * |expected|
    atol_steps: int = 0   # for quantized outputs: atol in quantization steps instead (0 = use atol)


LEVELS: dict[str, Level] = {level.name: level for level in (
    Level("exact", 0.0, 0.0, 0.0),
    Level("close", 1e-7, 1e-7, 0.0),
    Level("approximate", 1e-4, 5e-4, 0.0, atol_steps=1),
    Level("very", 5e-2, 1e-2, 0.0),
    Level("super", 0.1, 0.05, 1e-4),
    Level("ultra", 0.2, 0.1, 5e-4),
)}


@dataclass(frozen=True)
class Comparison:
    level: str
    ok: bool
    max_abs_err: float
    max_rel_err: float
    mismatches: int                          # elements outside the tolerance
    outlier_fraction: float
    first_mismatch: tuple[int, ...] | None   # index of the first such element, C order

    def to_dict(self) -> dict[str, object]:
        """As strict JSON takes it: an error that is not finite (inf, nan) is null."""
        return {"level": self.level, "ok": self.ok, "max_abs_err": _finite(self.max_abs_err),
                "max_rel_err": _finite(self.max_rel_err), "mismatches": self.mismatches,
                "outlier_fraction": self.outlier_fraction,
                "first_mismatch": list(self.first_mismatch) if self.first_mismatch is not None else None}


def _finite(value: float) -> float | None:
    return value if np.isfinite(value) else None


def outside(expected: np.ndarray, actual: np.ndarray, level: str, scale: float | None = None) -> np.ndarray:
    """Which elements of two equally shaped arrays differ beyond `level` (equal infinities and NaN with NaN agree)."""
    tolerance = LEVELS[level]
    expected = np.asarray(expected, dtype=np.float64)
    actual = np.asarray(actual, dtype=np.float64)
    if expected.shape != actual.shape:
        raise ValueError(f"cannot compare shapes {expected.shape} and {actual.shape}")
    atol: float | np.ndarray = tolerance.atol
    if scale is not None and tolerance.atol_steps:
        # the steps as float32 states them, and both values' own float32 rounding (2^-24 of each; the two are
        # within the steps of each other, whose share FLOAT32_STEP_SLACK covers)
        magnitude = np.where(np.isfinite(expected), np.abs(expected), 0.0)
        atol = tolerance.atol_steps * scale * (1 + FLOAT32_STEP_SLACK) + 2 * magnitude * FLOAT32_ROUNDING
    # equal values agree (the same infinity, NaN with NaN); an infinity against anything else is outside, as
    # is NaN against a number: the relative bound is taken from finite expectations only
    agree = (expected == actual) | (np.isnan(expected) & np.isnan(actual))
    with np.errstate(invalid="ignore"):
        error = np.abs(actual - expected)
    bound = atol + tolerance.rtol * np.where(np.isfinite(expected), np.abs(expected), 0.0)
    return ~agree & ~(error <= bound)


def compare(expected: np.ndarray, actual: np.ndarray, level: str, scale: float | None = None) -> Comparison:
    """Compare two equally shaped arrays at `level`; `scale` is the quantization step of quantized outputs."""
    bad = outside(expected, actual, level, scale)
    expected = np.asarray(expected, dtype=np.float64)
    actual = np.asarray(actual, dtype=np.float64)
    error = np.where(np.isnan(expected) & np.isnan(actual), 0.0, np.abs(actual - expected))
    relative = np.where(error == 0, 0.0, error / np.maximum(np.abs(expected), np.finfo(np.float64).tiny))
    count = int(bad.sum())
    fraction = count / bad.size if bad.size else 0.0
    first = tuple(int(i) for i in np.unravel_index(int(np.argmax(bad)), bad.shape)) if count else None
    return Comparison(level, fraction <= LEVELS[level].outliers, float(np.max(error, initial=0.0)),
                      float(np.max(relative, initial=0.0)), count, fraction, first)
