"""Python thread pools forgotten in a forked child (`-j N` trial workers are forked from the tune stage).

A forked process has only the thread that forked; a ThreadPoolExecutor copied into it still believes its
threads exist and would wait for them forever. Each object that keeps a pool in `_pool` registers here,
and the child drops those pools at once, so the first layer that wants threads starts new ones.
"""

from __future__ import annotations

import os
import weakref

_OWNERS: weakref.WeakSet = weakref.WeakSet()


def forget_pool_after_fork(owner: object) -> None:
    """Make a forked child set `owner._pool = None`."""
    _OWNERS.add(owner)


def _forget_pools() -> None:
    for owner in list(_OWNERS):
        owner._pool = None  # every registered owner keeps its pool there


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pools)
