"""Content hashes and canonical JSON: the vocabulary of cache keys."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

_CHUNK = 1 << 20


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no whitespace, so equal data always hashes equal."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def hash_value(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


def hash_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while chunk := stream.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def hash_tree(root: Path, exclude: frozenset[str] = frozenset()) -> dict[str, dict[str, Any]]:
    """`{relative posix path: {sha256, size}}` for every regular file below `root`."""
    files = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        name = path.relative_to(root).as_posix()
        if name in exclude:
            continue
        files[name] = {
            "sha256": hash_file(path),
            "size": path.stat().st_size,
        }
    return files
