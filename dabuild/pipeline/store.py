"""The content-addressed run cache: stage outputs stored under their cache key.

Layout: `<root>/v1/entries/<key[:2]>/<key>/` holds the stage's files and a
manifest of their hashes. An entry is built in `<root>/v1/tmp/` and renamed into
place, so a reader sees a whole entry or none. Stored files are made read-only
because restores hardlink them into build folders; every restore re-hashes the
files, and an entry that fails is dropped so the stage is rebuilt.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from dabuild.pipeline.manifest import MANIFEST, Manifest

LAYOUT = "v1"
_READ_ONLY = stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH


def default_root() -> Path:
    """`$DABUILD_CACHE`, else the platform's user cache folder."""
    configured = os.environ.get("DABUILD_CACHE")
    if configured:
        return Path(configured).expanduser()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("dabuild"))


@dataclass(frozen=True)
class StoreInfo:
    root: Path
    entries: int
    size: int


class Store:
    def __init__(self, root: Path | None = None):
        self.root = (root or default_root()) / LAYOUT
        self._entries = self.root / "entries"
        self._tmp = self.root / "tmp"

    def _entry(self, key: str) -> Path:
        return self._entries / key[:2] / key

    def lookup(self, key: str) -> Manifest | None:
        """The manifest of a complete entry for `key` (not yet verified), or None."""
        manifest = Manifest.read(self._entry(key))
        return manifest if manifest is not None and manifest.key == key else None

    def restore(self, key: str, dest: Path) -> Manifest | None:
        """Link or copy the entry's files into the empty folder `dest` and verify them.

        Returns None, after dropping the entry, when it is missing pieces or its
        files no longer match their hashes; `dest` is then left for the caller to discard.
        """
        entry = self._entry(key)
        manifest = self.lookup(key)
        if manifest is None:
            return None
        if not manifest.matches(entry, deep=True):
            self.drop(key)
            return None
        for name in manifest.files:
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(entry / name, target)
            except OSError:
                shutil.copy2(entry / name, target)
        os.utime(entry / MANIFEST)  # the entry's mtime records its last use, for pruning
        return manifest

    def save(self, folder: Path, manifest: Manifest) -> None:
        """Copy a finished stage folder into the store under `manifest.key`."""
        final = self._entry(manifest.key)
        if self.lookup(manifest.key) is not None:
            return
        self._tmp.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=manifest.key[:12] + "-", dir=self._tmp))
        try:
            for name in manifest.files:
                target = staging / name
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(folder / name, target)
                target.chmod(_READ_ONLY)
            manifest.write(staging)
            final.parent.mkdir(parents=True, exist_ok=True)
            if final.exists():  # a partial or stale entry under this key: replace it
                self.drop(manifest.key)
            os.rename(staging, final)
        except OSError:
            pass  # another process stored the same key first, or the disk is full: the build goes on
        finally:
            shutil.rmtree(staging, ignore_errors=True, onerror=_make_writable)

    def drop(self, key: str) -> None:
        _remove_tree(self._entry(key))

    def _all_entries(self) -> list[Path]:
        if not self._entries.is_dir():
            return []
        return [entry for shard in self._entries.iterdir() for entry in shard.iterdir()]

    def info(self) -> StoreInfo:
        entries = self._all_entries()
        return StoreInfo(self.root, len(entries), sum(_tree_size(e) for e in entries))

    def prune(self, max_size: int) -> tuple[int, int]:
        """Drop least recently used entries (and stale temporaries) until at most `max_size` bytes remain.

        Returns (entries removed, bytes freed).
        """
        _remove_tree(self._tmp)
        entries = []
        for entry in self._all_entries():
            manifest_path = entry / MANIFEST
            used = manifest_path.stat().st_mtime if manifest_path.exists() else 0.0
            entries.append((used, _tree_size(entry), entry))
        total = sum(size for _, size, _ in entries)
        removed = freed = 0
        for _, size, entry in sorted(entries, key=lambda e: e[0]):
            if total <= max_size:
                break
            _remove_tree(entry)
            total -= size
            removed += 1
            freed += size
        return removed, freed


def _tree_size(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def _make_writable(function, path, _excinfo) -> None:  # noqa: ANN001 - shutil's onerror signature
    """Read-only files sit in writable folders, so only the folder may need its write bit."""
    os.chmod(os.path.dirname(path), stat.S_IRWXU)
    function(path)


def _remove_tree(root: Path) -> None:
    if root.exists():
        shutil.rmtree(root, onerror=_make_writable)
