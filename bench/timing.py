"""Timing shared by the benchmarks: the fastest call within a time window.

The fastest call, not the mean: on a shared machine other processes only ever
add time, so the minimum is the most repeatable estimate of the cost.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable


def fastest(call: Callable[[], object], seconds: float) -> float:
    """Seconds of the fastest call made within `seconds` (after one warm-up call)."""
    call()
    best, deadline = math.inf, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best
