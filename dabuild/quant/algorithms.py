"""Calibration algorithms: each turns one channel's stored histogram into a quantization range.

They read only the `Bins` of a histogram (and the exact min/max it carries),
so trying another algorithm never re-runs the model. Every algorithm returns
(low, high) inside the observed [min, max]; for the symmetric scheme the range
is (-t, t), for the asymmetric one it may be lopsided. `Levels` tells an
algorithm how many integer steps the range will be cut into.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dabuild.quant.histogram import BINS, Bins

DEFAULT_PERCENTILE = 99.99
ENTROPY_SYMMETRIC_LEVELS = 128  # TensorRT's int8 entropy calibration: 128 quantized bins over [0, t]
MSE_CANDIDATES = 256            # candidate range ends per side for the asymmetric mse search


@dataclass(frozen=True)
class Levels:
    """The integer range a tensor is quantized to, and its scheme."""

    qmin: int
    qmax: int
    scheme: str  # "sym" or "asym"

    @property
    def steps(self) -> int:
        """Quantization steps across a symmetric range [-t, t] or an asymmetric [a, b]."""
        return 2 * self.qmax if self.scheme == "sym" else self.qmax - self.qmin


Range = tuple[float, float]
Algorithm = Callable[..., Range]


def _symmetric(t: float) -> Range:
    return (-t, t)


def minmax(bins: Bins, levels: Levels) -> Range:
    """The exact extremes (for sym, the largest magnitude on both sides)."""
    if levels.scheme == "sym":
        return _symmetric(max(abs(bins.low), abs(bins.high)))
    return (bins.low, bins.high)


def _quantile(bins: Bins, fraction: float) -> float:
    """The value below which `fraction` of the counts lie, interpolated linearly inside its bin."""
    cumulative = np.cumsum(bins.counts)
    target = fraction * cumulative[-1]
    index = min(int(np.searchsorted(cumulative, target, side="left")), len(bins.counts) - 1)
    before = cumulative[index - 1] if index > 0 else 0
    edges = bins.edges()
    inside = (target - before) / bins.counts[index] if bins.counts[index] else 0.0
    return float(np.clip(edges[index] + inside * (edges[index + 1] - edges[index]), bins.low, bins.high))


def percentile(bins: Bins, levels: Levels, percentile: float = DEFAULT_PERCENTILE) -> Range:
    """Keep `percentile` % of the values: of |x| for sym, cutting half the rest from each tail for asym."""
    if not 0 < percentile <= 100:
        raise ValueError(f"percentile must be in (0, 100], got {percentile}")
    if bins.width == 0:
        return minmax(bins, levels)
    if levels.scheme == "sym":
        return _symmetric(_quantile(bins.fold(), percentile / 100))
    cut = (100 - percentile) / 200
    return (_quantile(bins, cut), _quantile(bins, 1 - cut))


def _xlogx(values: np.ndarray) -> np.ndarray:
    return values * np.log(np.where(values > 0, values, 1.0))


def _entropy_threshold(counts: np.ndarray, quantized_bins: int) -> int:
    """TensorRT's search: the number of |x| bins i whose clipped histogram P (the values beyond
    added to bin i-1) loses least information, KL(P || Q), when squeezed into `quantized_bins`
    levels Q (each level's count spread evenly over its non-empty bins).

    Unlike TensorRT, the bin at zero keeps its own level: the lowering makes 0
    exactly representable, and smearing the spike of a relu output's zeros over
    a wide first level would push every search towards heavy clipping.

    KL is computed for every i at once from prefix sums: with c' the clipped
    counts, N their total and C_i the kept total, N * KL = sum c' log c' -
    sum over levels of s log(s / used) - tail * log Q[i-1] + N log(C_i / N).
    """
    c = counts.astype(np.float64)
    total = c.sum()
    prefix = np.concatenate([[0.0], np.cumsum(c)])
    used_prefix = np.concatenate([[0], np.cumsum(c > 0)])
    entropy_prefix = np.concatenate([[0.0], np.cumsum(_xlogx(c))])
    kept = np.arange(quantized_bins, len(c) + 1)
    levels = np.arange(quantized_bins)  # level boundaries: bin 0 alone, then quantized_bins - 1 levels over [1, i)
    bounds = 1 + (levels[None, :] * (kept[:, None] - 1)) // (quantized_bins - 1)
    sums = prefix[bounds[:, 1:]] - prefix[bounds[:, :-1]]
    used = used_prefix[bounds[:, 1:]] - used_prefix[bounds[:, :-1]]
    level_terms = _xlogx(c[0]) + np.sum(np.where(used > 0, _xlogx(sums) - sums * np.log(np.maximum(used, 1)), 0.0),
                                        axis=1)
    kept_total = prefix[kept]
    tail = total - kept_total
    last = c[kept - 1]
    last_level = np.where(used[:, -1] > 0, sums[:, -1] / np.maximum(used[:, -1], 1), 0.0) * (last > 0)
    smoothed = np.where(last_level > 0, last_level, 1e-12 * kept_total)  # Q empty where P is not
    p_log_p = entropy_prefix[kept] - _xlogx(last) + _xlogx(last + tail)
    q_log_p = level_terms + np.where(tail > 0, tail * np.log(np.maximum(smoothed, 1e-300)), 0.0)
    with np.errstate(divide="ignore"):
        divergence = (p_log_p - q_log_p) / total + np.log(kept_total / total)
    divergence[kept_total == 0] = np.inf
    # Ties keep the widest threshold.
    return int(kept[len(kept) - 1 - int(np.argmin(divergence[::-1]))])


def entropy(bins: Bins, levels: Levels) -> Range:
    """Threshold t on |x| minimising the KL divergence between the float and the quantized histogram.

    Symmetric int8 searches with 128 quantized bins over [0, t] (TensorRT's
    setting); an asymmetric scheme on one-signed data uses all of its levels,
    and on two-signed data clips both sides at the same t.
    """
    if bins.width == 0:
        return minmax(bins, levels)
    magnitudes = bins.fold().from_zero().coarsen(BINS)
    one_signed = bins.low >= 0 or bins.high <= 0
    quantized_bins = levels.steps + 1 if levels.scheme == "asym" and one_signed else ENTROPY_SYMMETRIC_LEVELS
    if len(magnitudes.counts) <= quantized_bins:
        return minmax(bins, levels)
    kept = _entropy_threshold(magnitudes.counts, quantized_bins)
    t = min((magnitudes.start + kept) * magnitudes.width, magnitudes.high)
    if levels.scheme == "sym":
        return _symmetric(t)
    return (max(bins.low, -t), min(bins.high, t))


def _clipping_error(centres: np.ndarray, counts: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Sum over bins of count * (centre - clip(centre, low, high))**2, for arrays of candidate (low, high)."""
    c0 = np.concatenate([[0.0], np.cumsum(counts)])
    c1 = np.concatenate([[0.0], np.cumsum(counts * centres)])
    c2 = np.concatenate([[0.0], np.cumsum(counts * centres**2)])
    below = np.searchsorted(centres, low, side="left")   # bins [0, below) lie under `low`
    above = np.searchsorted(centres, high, side="right")  # bins [above, n) lie over `high`
    under = c2[below] - 2 * low * c1[below] + low**2 * c0[below]
    over_count, over_sum, over_squares = c0[-1] - c0[above], c1[-1] - c1[above], c2[-1] - c2[above]
    over = over_squares - 2 * high * over_sum + high**2 * over_count
    return under + over


def mse(bins: Bins, levels: Levels) -> Range:
    """The range minimising the expected squared error: rounding (step**2 / 12 per value) plus
    clipping (squared distance to the range end per clipped value), both read off the histogram."""
    if bins.width == 0:
        return minmax(bins, levels)
    if levels.scheme == "sym":
        magnitudes = bins.fold()
        candidates = magnitudes.edges()[1:]
        centres, counts = magnitudes.centres(), magnitudes.counts.astype(np.float64)
        clipped = _clipping_error(centres, counts, np.zeros_like(candidates), candidates)
        rounding = counts.sum() * (2 * candidates / levels.steps) ** 2 / 12
        return _symmetric(float(candidates[np.argmin(clipped + rounding)]))
    # The lowering always keeps 0 inside the range, so candidate ends lie on either side of it.
    low, high = min(bins.low, 0.0), max(bins.high, 0.0)
    lows = low * (1 - np.arange(MSE_CANDIDATES) / MSE_CANDIDATES) if low < 0 else np.zeros(1)
    highs = high * (1 - np.arange(MSE_CANDIDATES) / MSE_CANDIDATES) if high > 0 else np.zeros(1)
    a, b = (grid.ravel() for grid in np.meshgrid(lows, highs, indexing="ij"))
    a, b = a[b > a], b[b > a]
    counts = bins.counts.astype(np.float64)
    error = _clipping_error(bins.centres(), counts, a, b) + counts.sum() * ((b - a) / levels.steps) ** 2 / 12
    best = int(np.argmin(error))
    return (max(float(a[best]), bins.low), min(float(b[best]), bins.high))


ALGORITHMS: dict[str, Algorithm] = {"minmax": minmax, "percentile": percentile, "entropy": entropy, "mse": mse}
