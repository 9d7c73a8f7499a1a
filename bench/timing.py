"""Timing shared by the benchmarks: the fastest call within a time window.

The fastest call, not the mean: on a shared machine other processes only ever
add time, so the minimum is the most repeatable estimate of the cost.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable


def fastest(call: Callable[[], object], seconds: float, clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds of the fastest call made within `seconds` (after one warm-up call), by `clock`.

    `time.thread_time` measures a single-threaded call by the CPU time of its thread: on a machine
    shared with other work, time spent waiting for a core does not count.
    """
    call()
    best, deadline = math.inf, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = clock()
        call()
        best = min(best, clock() - start)
    return best
