"""Streaming per-channel histograms whose bins sit on a grid anchored at zero.

Every channel counts its values in BINS bins of one width w, a power of two;
bin edges are the multiples k * w, and the window of BINS bins slides and
widens as batches arrive. When a batch falls outside the window, the width
doubles until the whole range fits, and each pair of old bins merges into one
new bin. Because floor(x / 2w) == floor(floor(x / w) / 2) holds exactly in
binary floating point, re-binning loses no count and never smears a count
across two bins. And since w is always the narrowest power of two whose grid
fits the range seen so far, the final histogram depends only on the values,
not on how they were split into batches. The zero anchor also makes |x|
foldable without approximation (bin k of |x| is bins k and -k-1 of x), which
symmetric schemes need.

Memory is BINS counts per channel whatever the number of samples: int32 ones for a histogram of many
channels (`Histogram.empty(..., narrow=True)`) until a channel could count past 2^31 - 1 values
(`Histogram.make_room`), int64 ones otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dabuild.ir.kernels.native import native_histogram

BINS = 2048
NARROW_COUNT_LIMIT = np.iinfo(np.int32).max  # values an int32 channel row may count in all
# A width finer than this fraction of the magnitude would make grid indices overflow int64.
_FINEST_RELATIVE_WIDTH = 2.0**-40


def _fits(low: np.ndarray, high: np.ndarray, width: np.ndarray) -> np.ndarray:
    return np.floor(high / width) - np.floor(low / width) < BINS


def _widened(low: np.ndarray, high: np.ndarray, width: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each width doubled until its grid puts [low, high] within BINS bins, and how many doublings that took
    (fitting is monotone in the width, so this stops at the narrowest)."""
    doublings = np.zeros(len(width), dtype=np.int64)
    while True:
        short = ~_fits(low, high, width)
        if not short.any():
            return width, doublings
        width = np.where(short, width * 2, width)
        doublings += short


def _narrowest_width(low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """The smallest power of two whose grid puts [low, high] (low < high) within BINS bins, per channel."""
    width = 2.0 ** (np.floor(np.log2((high - low) / BINS)) - 1)
    width = np.maximum(width, 2.0 ** np.floor(np.log2(np.maximum(abs(low), abs(high)) * _FINEST_RELATIVE_WIDTH)))
    return _widened(low, high, width)[0]


@dataclass(frozen=True)
class Bins:
    """One channel's occupied bins: counts[i] counts values in [(start + i) * width, (start + i + 1) * width).

    `low` and `high` are the exact extremes, so the outer edges can be tightened to them.
    """

    counts: np.ndarray  # int64, first and last entries non-zero
    start: int
    width: float
    low: float
    high: float

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    def edges(self) -> np.ndarray:
        """len(counts) + 1 bin edges, the outermost replaced by the exact extremes."""
        edges = (self.start + np.arange(len(self.counts) + 1, dtype=np.float64)) * self.width
        edges[0], edges[-1] = self.low, self.high
        return edges

    def centres(self) -> np.ndarray:
        edges = self.edges()
        return (edges[:-1] + edges[1:]) / 2

    def mean(self) -> float:
        """The mean of the counted values, each taken at its bin's centre (off by at most width / 2)."""
        return float(np.dot(self.counts, self.centres()) / self.total)

    def fold(self) -> Bins:
        """The histogram of |x|: exact, since bin k of |x| gathers bins k and -k-1 of x."""
        grid = self.start + np.arange(len(self.counts))
        folded = np.where(grid >= 0, grid, -grid - 1)
        counts = np.bincount(folded, weights=self.counts, minlength=int(folded.max()) + 1).astype(np.int64)
        first = int(np.flatnonzero(counts)[0])
        low = 0.0 if self.low <= 0.0 <= self.high else min(abs(self.low), abs(self.high))
        return Bins(counts[first:], first, self.width, low, max(abs(self.low), abs(self.high)))

    def from_zero(self) -> Bins:
        """The same counts with the window extended down to the bin at zero (for |x| threshold searches)."""
        if self.start <= 0:
            return self
        counts = np.concatenate([np.zeros(self.start, dtype=np.int64), self.counts])
        return Bins(counts, 0, self.width, 0.0, self.high)

    def coarsen(self, max_bins: int) -> Bins:
        """Merge groups of k neighbouring grid bins (still multiples of k * width) until at most max_bins remain."""
        factor = 1
        while (self.start + len(self.counts) - 1) // factor - self.start // factor + 1 > max_bins:
            factor *= 2
        if factor == 1:
            return self
        grid = (self.start + np.arange(len(self.counts))) // factor
        start = int(grid[0])
        counts = np.bincount(grid - start, weights=self.counts).astype(np.int64)
        return Bins(counts, start, self.width * factor, self.low, self.high)


@dataclass(eq=False)
class Histogram:
    """Per-channel counts, exact minimum and maximum of a stream of values.

    A channel whose values have all been equal so far has width 0 and keeps
    its count in bin 0; it gets a grid as soon as a second value appears.
    """

    counts: np.ndarray  # int32 or int64 (channels, BINS)
    width: np.ndarray   # float64 (channels,)
    offset: np.ndarray  # int64 (channels,): grid index of counts[:, 0]
    low: np.ndarray     # float64 (channels,), +inf before any value
    high: np.ndarray    # float64 (channels,), -inf before any value

    @classmethod
    def empty(cls, channels: int, narrow: bool = False) -> Histogram:
        """No values yet; `narrow`: int32 counts (see `make_room`)."""
        return cls(np.zeros((channels, BINS), dtype=np.int32 if narrow else np.int64), np.zeros(channels),
                   np.zeros(channels, dtype=np.int64), np.full(channels, np.inf), np.full(channels, -np.inf))

    def make_room(self, counted: int, more: int) -> None:
        """Widen int32 counts to int64 if a channel that has counted `counted` values could pass 2^31 - 1 with
        `more` (no bin can hold more than its channel's values, so below that none overflows)."""
        if self.counts.dtype != np.int64 and counted + more > NARROW_COUNT_LIMIT:
            self.counts = self.counts.astype(np.int64)

    @property
    def channels(self) -> int:
        return len(self.width)

    def add(self, values: np.ndarray) -> None:
        """Count finite values of shape (channels, n), widening each channel's window as needed."""
        values = np.asarray(values, dtype=np.float64)
        if values.shape[0] != self.channels:
            raise ValueError(f"histogram has {self.channels} channels, got values for {values.shape[0]}")
        if values.shape[1] == 0:
            return
        self.extend(values.min(axis=1), values.max(axis=1))
        gridded = self.width > 0
        safe_width = np.where(gridded, self.width, 1.0)[:, None]
        index = np.where(gridded[:, None], np.floor(values / safe_width).astype(np.int64) - self.offset[:, None], 0)
        flat = index + (np.arange(self.channels) * BINS)[:, None]
        self.counts += np.bincount(flat.ravel(), minlength=self.channels * BINS).reshape(self.channels, BINS)

    def extend(self, lows: np.ndarray, highs: np.ndarray) -> None:
        """Widen each channel's window to take values from lows[c] to highs[c] (counting them is the caller's).

        A channel whose range grew is re-binned (all such channels at once) so that its window covers the
        new range, which contains every value seen. A channel still holding a single value keeps its
        count in bin 0.
        """
        low = np.minimum(self.low, lows)
        high = np.maximum(self.high, highs)
        grown = ((low < self.low) | (high > self.high)) & (low != high)
        fresh = np.flatnonzero(grown & (self.width == 0))
        if len(fresh):
            self._grid(fresh, low[fresh], high[fresh])
        widened = np.flatnonzero(grown & (self.width > 0))
        if len(widened):
            self._rebin(widened, low[widened], high[widened])
        self.low, self.high = low, high

    def window(self, channel: int) -> tuple[float, float]:
        """[low, high) in value of the values channel `channel`'s row counts (exact: offset * a power of two)."""
        width, offset = float(self.width[channel]), int(self.offset[channel])
        return offset * width, (offset + BINS) * width

    def reciprocals(self) -> np.ndarray:
        """1 / width per channel (exact: widths are powers of two), 0 for a channel still without a grid."""
        return np.divide(1.0, self.width, out=np.zeros_like(self.width), where=self.width > 0)

    def _grid(self, channels: np.ndarray, low: np.ndarray, high: np.ndarray) -> None:
        """First grids for channels that held one value so far: its count moves to that value's bin."""
        width = _narrowest_width(low, high)
        offset = np.floor(low / width).astype(np.int64)
        seen = self.counts[channels, 0].copy()
        self.counts[channels, 0] = 0  # a channel without a grid has counted into bin 0 alone
        counted = seen > 0
        bins = np.floor(self.low[channels][counted] / width[counted]).astype(np.int64) - offset[counted]
        self.counts[channels[counted], bins] = seen[counted]
        self.width[channels], self.offset[channels] = width, offset

    def _rebin(self, channels: np.ndarray, low: np.ndarray, high: np.ndarray) -> None:
        """Wider (or slid) windows for gridded channels: old bin k goes to (offset + k) >> doublings, exactly."""
        width, doublings = _widened(low, high, self.width[channels])
        offset = np.floor(low / width).astype(np.int64)
        native = native_histogram()
        if native is not None and self.counts.flags.c_contiguous and self.counts.dtype == np.int32:
            native.rebin(self.counts, channels, self.offset[channels], doublings, offset)
            self.width[channels], self.offset[channels] = width, offset
            return
        old = self.counts[channels]
        rows, bins = np.nonzero(old)
        grid = ((self.offset[channels][rows] + bins) >> doublings[rows]) - offset[rows]
        moved = np.zeros_like(old)
        np.add.at(moved, (rows, grid), old[rows, bins])
        self.counts[channels] = moved
        self.width[channels], self.offset[channels] = width, offset

    def bins(self, channel: int) -> Bins:
        """The occupied bins of one channel (a single bin of width 0 when all its values are equal)."""
        counts = self.counts[channel]
        occupied = np.flatnonzero(counts)
        if len(occupied) == 0:
            raise ValueError("histogram channel has no values")
        first, last = int(occupied[0]), int(occupied[-1])
        return Bins(counts[first:last + 1].astype(np.int64), int(self.offset[channel]) + first, float(self.width[channel]),
                    float(self.low[channel]), float(self.high[channel]))

    __hash__ = None  # type: ignore[assignment]  # mutable and compared by value: unhashable, as with no __hash__

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Histogram):
            return NotImplemented
        return all(np.array_equal(getattr(self, f), getattr(other, f))
                   for f in ("counts", "width", "offset", "low", "high"))
