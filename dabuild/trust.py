"""Who wrote a cache entry (or a compiled kernel): the team key, entry signatures and what counts as a shared store.

Integrity (every blob re-hashed against its manifest) proves an entry is whole;
it cannot prove who made it, because whoever can write a store can rewrite an
entry *and* its manifest. A shared store (any remote, or a local folder that is
not the user's own or that its group or the world may write) therefore serves
only entries whose manifest carries an HMAC-SHA256 signature made with the
team key. The key comes from `$DABUILD_CACHE_KEY` or from the file the
configuration's `key_file` names; anyone holding it may write trusted entries,
anyone without it may read nothing from a shared store.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import stat
from pathlib import Path
from typing import Any

KEY_ENV = "DABUILD_CACHE_KEY"
MIN_KEY_BYTES = 16
_DOMAIN = b"dabuild-entry-v1\0"  # a signature over one kind of record never verifies another kind


class TeamKey:
    """The secret a team shares; it signs and verifies records (a manifest, a trial score, a library)."""

    def __init__(self, secret: bytes, source: str):
        if len(secret) < MIN_KEY_BYTES:
            raise ValueError(f"the team key from {source} is shorter than {MIN_KEY_BYTES} bytes")
        self._secret = secret
        self.source = source

    def sign(self, kind: str, record: Any) -> str:
        canonical = json.dumps(record, sort_keys=True, separators=(",", ":"), default=str)  # as hashing.py's
        message = _DOMAIN + kind.encode() + b"\0" + canonical.encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()

    def verifies(self, kind: str, record: Any, signature: object) -> bool:
        return isinstance(signature, str) and hmac.compare_digest(self.sign(kind, record), signature)


def key_from(key_file: Path | None) -> TeamKey | None:
    """`$DABUILD_CACHE_KEY`, else the key file's first line; None when neither is given.

    Raises ValueError (naming the source) for a key file that cannot be read or a key too short to trust.
    """
    text = os.environ.get(KEY_ENV, "").strip()
    if text:
        return TeamKey(text.encode(), f"${KEY_ENV}")
    if key_file is None:
        return None
    try:
        line = key_file.read_text(encoding="utf-8").strip().splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"the team key file {key_file} cannot be read ({error})") from None
    return TeamKey(line[0].encode() if line else b"", str(key_file))


def shared_folder(folder: Path) -> str | None:
    """Why others may write `folder` (not the user's own, or group/world-writable), or None if only the user may.

    A folder that does not exist yet is the user's: dabuild creates it.
    """
    try:
        info = folder.stat()
    except OSError:
        return None
    if info.st_uid != os.getuid():
        return f"is owned by user id {info.st_uid}"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return "is group- or world-writable"
    return None
