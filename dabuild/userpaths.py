"""The files a user names, checked before anything opens them.

Opening is where special files hurt: a FIFO blocks the reader forever,
/dev/zero never ends, a symlink loop or an over-long name raises deep inside a
stage. So every path a recipe or a command names is resolved and `stat`ed here
first, and only a regular file (or a folder where a folder is meant) of a sane
size passes; anything else is one sentence the caller puts at the recipe's line.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

MAX_NAME_BYTES = 255            # longest file name (one path component) Linux and macOS file systems take
MAX_FILE_BYTES = 16 * 1024**3   # a larger model or data file is refused rather than read into memory
_KINDS = {stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFSOCK: "a socket"}


class PathProblem(ValueError):
    """Why a named path cannot be read; its message is written for the user."""


def checked_path(path: Path | str, folder_ok: bool = False, max_bytes: int = MAX_FILE_BYTES,
                 shown: str | None = None) -> Path:
    """`path` resolved, if it is a regular file (or, with `folder_ok`, a folder) of at most `max_bytes`.

    Messages name the path as `shown` (what the user wrote, e.g. relative to the recipe), else as given.
    """
    name = shown if shown is not None else str(path)
    for part in Path(path).parts:
        if len(os.fsencode(part)) > MAX_NAME_BYTES:
            raise PathProblem(f"file name too long ({len(part)} characters, at most {MAX_NAME_BYTES}): "
                              f"{part[:24]}...")
    try:
        resolved = Path(path).expanduser().resolve()
        info = resolved.stat()
    except RuntimeError:  # Python < 3.13 reports a loop while resolving so
        raise PathProblem(f"symbolic link loop: {name}") from None
    except OSError as error:
        if error.errno == errno.ENOENT:
            raise PathProblem(f"file not found: {name}") from None
        if error.errno == errno.ELOOP:
            raise PathProblem(f"symbolic link loop: {name}") from None
        raise PathProblem(f"cannot read {name}: {error.strerror}") from None
    if stat.S_ISDIR(info.st_mode):
        if folder_ok:
            return resolved
        raise PathProblem(f"{name} is a folder; expected a file")
    if not stat.S_ISREG(info.st_mode):
        kind = _KINDS.get(stat.S_IFMT(info.st_mode), "not a regular file")
        raise PathProblem(f"{name} is {kind}; dabuild reads only regular files")
    if info.st_size > max_bytes:
        raise PathProblem(f"{name} is {info.st_size:,} bytes; files over {max_bytes:,} bytes are refused")
    return resolved
