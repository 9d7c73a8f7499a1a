"""Thread pools of the native kernels: splitting a layer's rows among threads, and forgetting the pools in a
forked child (`-j N` trial workers are forked from the tune stage).

A forked process has only the thread that forked; a ThreadPoolExecutor copied into it still believes its
threads exist and would wait for them forever. Each object that keeps a pool in `_pool` registers here,
and the child drops those pools at once, so the first layer that wants threads starts new ones.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

_OWNERS: weakref.WeakSet = weakref.WeakSet()


def forget_pool_after_fork(owner: object) -> None:
    """Make a forked child set `owner._pool = None`."""
    _OWNERS.add(owner)


def _forget_pools() -> None:
    for owner in list(_OWNERS):
        owner._pool = None  # every registered owner keeps its pool there


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pools)


def split_rows(owner: Any, function: Callable[[Any, int, int], None], call: Any, rows: int, parts: int,
               workers: int, prefix: str) -> None:
    """function(call, first, end) over rows 0 .. rows - 1 in `parts` ranges: this thread takes the first,
    `owner._pool` (made on first use with `workers` threads named `prefix`) the others."""
    if parts <= 1:
        function(call, 0, rows)  # ctypes releases the GIL for the call
        return
    if owner._pool is None:
        owner._pool = ThreadPoolExecutor(workers, thread_name_prefix=prefix)
    bounds = [rows * part // parts for part in range(parts + 1)]
    others = [owner._pool.submit(function, call, low, high) for low, high in zip(bounds[1:-1], bounds[2:])]
    function(call, 0, bounds[1])
    for future in others:
        future.result()
