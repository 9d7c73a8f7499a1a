"""One dabuild at a time per build folder.

An advisory `flock` on `<build dir>/.lock`: the kernel releases it when the holder
dies (SIGKILL included), so a crash never leaves a stale lock behind. A second
process says whom it waits for, then waits.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from types import TracebackType

from dabuild.progress import Progress


class BuildLock:
    def __init__(self, build_dir: Path, progress: Progress):
        self.path = build_dir / ".lock"
        self.progress = progress
        self._fd: int | None = None

    def __enter__(self) -> BuildLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)  # a planted link is not followed
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            self.progress.info(
                f"waiting for another dabuild (pid {holder}) to finish with {self.path.parent}"
            )
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing releases the lock
            self._fd = None
