"""Warnings a user must see, each once per build: what dabuild did instead of what was asked.

A damaged cache entry dropped and rebuilt, a cache that cannot be written, a
native kernel that could not be built, a check that could not run a part:
none of them fails the build, and none may pass in silence. Any module calls
`warn`; the CLI prints each as `dabuild: warning: ...` on stderr (even with -q),
and `collect()` gathers a build's warnings for its build.json (per build, when
several build at once in threads: see `bound`).
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

LOGGER = logging.getLogger("dabuild.notices")
_lock = threading.Lock()
_bound = threading.local()  # .round: the collection this thread's warnings belong to


@dataclass(eq=False)
class _Round:
    """One build's warnings (several builds may run at once, in threads: `dabuild build` on a cluster)."""

    seen: set[str] = field(default_factory=set)
    warnings: list[str] = field(default_factory=list)


_outside = _Round()  # warnings while no collection runs
_active: list[_Round] = []


def warn(message: str, key: str | None = None) -> None:
    """Warn once for `key` (default: the message itself) per collection: the one this thread is bound to,
    else every collection running (a thread no build bound, such as the native kernels' compile)."""
    mark = key or message
    mine = getattr(_bound, "round", None)
    with _lock:
        rounds = [mine] if mine in _active else (list(_active) or [_outside])
        fresh = [r for r in rounds if mark not in r.seen]
        for collection in fresh:
            collection.seen.add(mark)
            collection.warnings.append(message)
    if fresh:
        LOGGER.warning(message)


@contextmanager
def collect() -> Iterator[list[str]]:
    """A fresh round of warnings (each warned once again) for this thread, yielding the list it fills."""
    collection = _Round()
    with _lock:
        _active.append(collection)
    with bound(collection):
        try:
            yield collection.warnings
        finally:
            with _lock:
                _active.remove(collection)


def current() -> object | None:
    """This thread's collection, for `bound` in the threads it starts."""
    return getattr(_bound, "round", None)


@contextmanager
def bound(collection: object | None) -> Iterator[None]:
    """Count this thread's warnings in `collection` (from `current()` in the thread that started it)."""
    previous = getattr(_bound, "round", None)
    _bound.round = collection
    try:
        yield
    finally:
        _bound.round = previous


class _Stderr(logging.Handler):
    """Writes to whatever sys.stderr is at the time (a test's capture, a redirected stream)."""

    def emit(self, record: logging.LogRecord) -> None:
        print(f"dabuild: warning: {record.getMessage()}", file=sys.stderr)


def print_to_stderr() -> None:
    """Show warnings as `dabuild: warning: ...` on stderr (installed once by the CLI)."""
    if any(isinstance(handler, _Stderr) for handler in LOGGER.handlers):
        return
    LOGGER.addHandler(_Stderr())
    LOGGER.setLevel(logging.WARNING)
    LOGGER.propagate = False
