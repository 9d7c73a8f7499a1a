"""Warnings a user must see, each once per build: what dabuild did instead of what was asked.

A damaged cache entry dropped and rebuilt, a cache that cannot be written, a
native kernel that could not be built, a check that could not run a part:
none of them fails the build, and none may pass in silence. Any module calls
`warn`; the CLI prints each as `dabuild: warning: ...` on stderr (even with -q),
and `collect()` gathers a build's warnings for its build.json.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

LOGGER = logging.getLogger("dabuild.notices")
_lock = threading.Lock()
_seen: set[str] = set()
_collected: list[str] = []


def warn(message: str, key: str | None = None) -> None:
    """Warn once for `key` (default: the message itself) until the next `collect()`."""
    with _lock:
        if (key or message) in _seen:
            return
        _seen.add(key or message)
        _collected.append(message)
    LOGGER.warning(message)


@contextmanager
def collect() -> Iterator[list[str]]:
    """A fresh round of warnings (each warned once again), yielding the list this round fills."""
    with _lock:
        _seen.clear()
        _collected.clear()
    yield _collected


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
