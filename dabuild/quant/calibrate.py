"""Calibration: stream data through the float graph and record each tensor's range.

Only running statistics are kept (a min and a max per tensor), so memory is
bounded by the number of tensors, not by the amount of calibration data.
Observers that need more (histograms for percentile / entropy, per-channel
ranges) add arrays to `Stats` under their own key prefix.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dabuild.errors import BuildError
from dabuild.ir.graph import Graph
from dabuild.ir.interpreter import run
from dabuild.progress import Progress
from dabuild.ir.npz import read_npz, write_npz

STATS_FILE = "stats.npz"
_RANGE = "range/"


@dataclass
class Stats:
    """Per-tensor (min, max) of the graph inputs and of every node output."""

    ranges: dict[str, tuple[float, float]] = field(default_factory=dict)

    def observe(self, name: str, values: np.ndarray) -> None:
        """Widen the range of `name` to cover `values`."""
        if values.size == 0:
            return
        lo, hi = float(np.min(values)), float(np.max(values))
        if not (np.isfinite(lo) and np.isfinite(hi)):
            raise BuildError(f"calibration: tensor {name!r} holds NaN or infinite values")
        if name in self.ranges:
            old_lo, old_hi = self.ranges[name]
            lo, hi = min(lo, old_lo), max(hi, old_hi)
        self.ranges[name] = (lo, hi)

    def save(self, directory: Path) -> None:
        Path(directory).mkdir(parents=True, exist_ok=True)
        write_npz(Path(directory) / STATS_FILE,
                 {_RANGE + name: np.array(r, dtype=np.float64) for name, r in self.ranges.items()})

    @classmethod
    def load(cls, directory: Path) -> "Stats":
        arrays = read_npz(Path(directory) / STATS_FILE)
        return cls({key[len(_RANGE):]: (float(a[0]), float(a[1]))
                    for key, a in sorted(arrays.items()) if key.startswith(_RANGE)})

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able view for reports."""
        return {"ranges": {name: [lo, hi] for name, (lo, hi) in sorted(self.ranges.items())}}


def observed_tensors(graph: Graph) -> list[str]:
    """The tensors whose ranges quantization needs: graph inputs and node outputs."""
    return [spec.name for spec in graph.inputs] + [out for node in graph.nodes for out in node.outputs]


def calibrate(graph: Graph, batches: Iterable[dict[str, np.ndarray]], progress: Progress) -> Stats:
    """Run every batch through the float interpreter and merge the observed ranges."""
    stats = Stats()
    names = observed_tensors(graph)
    with progress.track("calibrate", None) as advance:
        for batch in batches:
            values = run(graph, batch, keep_intermediates=True)
            for name in names:
                stats.observe(name, np.asarray(values[name]))
            advance(len(next(iter(batch.values()))))
    if not stats.ranges:
        raise BuildError("calibration: no calibration samples were given")
    return stats
