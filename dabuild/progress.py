"""Progress for long stages: a live line on a terminal, sparse plain lines otherwise.

Stage functions take a `Progress` and call `track(label, total)`; they never
know whether a human is watching. `Progress.silent()` is the default for library use.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO


class Progress:
    """Reports advancing work; `level` 0 is quiet, 1 normal, 2 verbose."""

    def __init__(self, stream: TextIO | None = None, level: int = 1, live: bool | None = None):
        self._stream = stream
        self.level = level
        self.live = self.stream.isatty() if live is None else live

    @property
    def stream(self) -> TextIO:
        """The given stream, else whatever sys.stderr is now (an interrupted build points it at /dev/null, so
        stage threads still finishing print nothing after its last line)."""
        return self._stream if self._stream is not None else sys.stderr

    @classmethod
    def silent(cls) -> Progress:
        return cls(level=0, live=False)

    def info(self, message: str) -> None:
        """A line shown at normal verbosity."""
        if self.level >= 1:
            self._line(message)

    def debug(self, message: str) -> None:
        """A line shown only with -v."""
        if self.level >= 2:
            self._line(message)

    def status(self, message: str) -> None:
        """A line that replaces itself on a terminal (where a long loop stands); nothing in a log."""
        if self.live and self.level >= 1:
            self.stream.write("\r\x1b[K" + message)
            self.stream.flush()

    def _line(self, message: str) -> None:
        if self.live:
            self.stream.write("\r\x1b[K")
        self.stream.write(message + "\n")
        self.stream.flush()

    @contextmanager
    def track(self, label: str, total: int | None = None) -> Iterator[Callable[[int], None]]:
        """Yield `advance(n)`; a terminal sees a live counter, a log sees start and end lines."""
        done = 0
        start = time.monotonic()
        last_draw = 0.0

        def advance(n: int = 1) -> None:
            nonlocal done, last_draw
            done += n
            now = time.monotonic()
            of = f"/{total:,}" if total else ""
            if self.live and self.level >= 1 and now - last_draw > 0.1:
                last_draw = now
                self.stream.write(f"\r\x1b[K  {label}: {done:,}{of}")
                self.stream.flush()
            elif not self.live and self.level >= 1 and now - max(last_draw, start) > 10:  # a log: a line each 10 s
                last_draw = now
                self.stream.write(f"  {label}: {done:,}{of} after {now - start:.0f}s\n")
                self.stream.flush()

        if not self.live:
            self.debug(f"  {label}: started" + (f" ({total})" if total else ""))
        yield advance
        elapsed = time.monotonic() - start
        if self.live and self.level >= 1:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
        self.debug(f"  {label}: {done} done in {elapsed:.2f}s")


def human_size(size: float) -> str:
    """1536 -> '1.5 KiB': sizes people read."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")
