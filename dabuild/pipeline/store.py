"""The content-addressed run cache: stage outputs stored under their cache key.

Layout: `<root>/v1/entries/<key[:2]>/<key>/` holds the stage's files and a
manifest of their hashes. An entry is built in `<root>/v1/tmp/` and renamed into
place, so a reader sees a whole entry or none. Stored files are made read-only
because restores hardlink them into build folders.

Every entry proves itself before use: a restore re-hashes the files against the
manifest and the manifest's key parts against the key; an entry that fails is
dropped, the stage is rebuilt, and the user is warned once. A cache that cannot
be written (full, read-only) is used for reading only, with one warning: the
build goes on without storing, and leaves nothing temporary behind.

Who wrote an entry matters as much as whether it is whole (dabuild/trust.py):
a cache folder that others may write is *shared*, and serves only entries whose
manifest is signed by the team key (`<key>.sig` beside the entry). With a team
key every stored entry is signed. Without one, a shared folder is neither read
nor written, with one warning.

A remote (pipeline/remote.py) extends the store: `restore_remote` fetches a
verified entry the local store lacks (and keeps it locally), and `save` pushes
what a stage produced. The API the pipeline uses is `lookup`, `restore`,
`restore_remote`, `save`, `push` and `drop`.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from dabuild.notices import warn
from dabuild.pipeline.hashing import hash_value
from dabuild.pipeline.manifest import MANIFEST, Manifest
from dabuild.pipeline.remote import Remote
from dabuild.trust import TeamKey, shared_folder

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
    name: str = "run cache"


@dataclass(frozen=True)
class _Item:
    """One prunable thing of any store: a run-cache entry, a trial context, a compiled kernel."""

    path: Path
    size: int
    used: float  # last use (mtime), the least recently used go first


class Store:
    def __init__(self, root: Path | None = None, key: TeamKey | None = None, remote: Remote | None = None):
        base = root or default_root()
        self.root = base / LAYOUT
        self._entries = self.root / "entries"
        self._tmp = self.root / "tmp"
        self.key = key
        self.remote = remote
        self.writable = True  # until a write fails: then the build goes on without storing
        self.shared = shared_folder(base) or shared_folder(self.root)  # why others may write it, or None
        self._readable = True
        if self.shared and key is None:
            self._readable = self.writable = False
            warn(f"the run cache {base} {self.shared}, so it is shared, and no team key is set "
                 "($DABUILD_CACHE_KEY or key_file in dabuild-cache.yaml): its entries are not trusted and "
                 "nothing is stored in it")

    def _entry(self, key: str) -> Path:
        return self._entries / key[:2] / key

    def _signature(self, key: str) -> Path:
        return self._entries / key[:2] / f"{key}.sig"

    def lookup(self, key: str) -> Manifest | None:
        """The manifest of a complete entry for `key` (not yet verified), or None."""
        if not self._readable:
            return None
        manifest = Manifest.read(self._entry(key))
        return manifest if manifest is not None and manifest.key == key else None

    def restore_remote(self, key: str, dest: Path) -> Manifest | None:
        """Fetch the entry from the remote into the empty folder `dest` (verified: signed, every blob
        re-hashed) and keep a copy locally; None on a miss, a bad entry or a failing remote."""
        if self.remote is None:
            return None
        manifest = self.remote.fetch(key, dest)
        if manifest is not None:
            self._save_local(dest, manifest)
        return manifest

    def push(self, key: str) -> bool:
        """Upload the local entry for `key` to the remote once it proves itself; True when the remote has it."""
        manifest = self.lookup(key)
        if self.remote is None or manifest is None or self._disproof(self._entry(key), manifest) is not None:
            return False
        return self.remote.push(self._entry(key), manifest)

    def restore(self, key: str, dest: Path) -> Manifest | None:
        """Link or copy the entry's files into the empty folder `dest` and verify them.

        Returns None, after dropping the entry and warning once, when it is missing
        pieces, its manifest does not hash to its key, or its files no longer match
        their hashes; `dest` is then left for the caller to discard.
        """
        entry = self._entry(key)
        manifest = self.lookup(key)
        if manifest is None:
            return None
        problem = self._disproof(entry, manifest)
        if problem is not None:
            warn(f"run cache entry {key[:12]} ({manifest.stage}) {problem}; dropped, the stage runs again",
                 key=f"entry {key}")
            self.drop(key)
            return None
        try:
            for name in manifest.files:
                target = dest / name
                target.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.link(entry / name, target)
                except OSError:
                    shutil.copy2(entry / name, target)
        except OSError as error:
            if error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
                raise  # the build folder cannot take the files: the build reports that, naming it
            # the entry vanished meanwhile (a concurrent prune) or cannot be read: rebuild
            warn(f"run cache entry {key[:12]} ({manifest.stage}) could not be read ({error.strerror}); "
                 "the stage runs again", key=f"entry {key}")
            return None
        try:
            os.utime(entry / MANIFEST)  # the entry's mtime records its last use, for pruning
        except OSError:
            pass  # a read-only cache: its entries are still good to read
        return manifest

    def _disproof(self, entry: Path, manifest: Manifest) -> str | None:
        """Why the entry cannot be trusted, or None when its manifest and files prove it."""
        if hash_value(manifest.parts) != manifest.key:
            return "has a manifest that does not hash to its key"
        if self.shared and not self._signed(manifest):
            return f"is not signed by the team key (the cache {self.shared})"
        for name, info in manifest.files.items():
            path = entry / name
            if not path.is_file() or path.is_symlink():
                return f"is missing {name}"
            if path.stat().st_size != info["size"]:
                return f"has {name} of the wrong size"
        if not manifest.matches(entry, deep=True):
            return "has files that do not match their hashes"
        return None

    def _signed(self, manifest: Manifest) -> bool:
        if self.key is None:
            return False
        try:
            signature = self._signature(manifest.key).read_text().strip()
        except (OSError, UnicodeDecodeError):
            return False
        return self.key.verifies("manifest", asdict(manifest), signature)

    def save(self, folder: Path, manifest: Manifest) -> None:
        """Store a finished stage folder under `manifest.key`, then push it to the remote (unless read-only).

        A failure to write (disk full, read-only, no permission) is warned about once
        and turns storing off for the rest of the build; the build itself goes on.
        """
        self._save_local(folder, manifest)
        if self.remote is not None:
            self.remote.push(folder, manifest)

    def _save_local(self, folder: Path, manifest: Manifest) -> None:
        if not self.writable or self.lookup(manifest.key) is not None:
            return
        final = self._entry(manifest.key)
        staging: Path | None = None
        try:
            self._tmp.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=manifest.key[:12] + "-", dir=self._tmp))
            for name in manifest.files:
                target = staging / name
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(folder / name, target)
                target.chmod(_READ_ONLY)
            manifest.write(staging)
            final.parent.mkdir(parents=True, exist_ok=True)
            if self.key is not None:  # the signature first: an entry is never trusted before it
                signature = staging.with_suffix(".sig")
                signature.write_text(self.key.sign("manifest", asdict(manifest)) + "\n")
                os.replace(signature, self._signature(manifest.key))
            if final.exists():  # a partial or stale entry under this key: replace it
                self.drop(manifest.key)
            os.rename(staging, final)
        except OSError as error:
            if self.lookup(manifest.key) is None:  # not merely another process storing the same key first
                self.writable = False
                warn(f"the run cache {self.root} cannot be written ({error.strerror or error}); "
                     "building without storing results in it")
        finally:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True, onerror=_make_writable)

    def drop(self, key: str) -> None:
        try:
            _remove_tree(self._entry(key))
            self._signature(key).unlink(missing_ok=True)
        except OSError:
            pass  # a read-only cache keeps its bad entry; it fails its proof again next time

    @property
    def trials_root(self) -> Path:
        """The trial store (dabuild/tune/trials.py) lives inside the run cache, and is pruned with it."""
        return self.root / "trials"

    @property
    def readable(self) -> bool:
        """False for a shared cache without a team key: nothing in it is trusted, trial scores included."""
        return self._readable

    @property
    def trials_key(self) -> TeamKey | None:
        """The key that signs trial records: the team's where others may write the cache, else none."""
        return self.key if self.shared else None

    def _all_entries(self) -> list[Path]:
        return _children(self._entries, depth=2)

    def info(self) -> StoreInfo:
        entries = self._all_entries()
        return StoreInfo(self.root, len(entries), sum(_tree_size(e) for e in entries))

    def infos(self) -> list[StoreInfo]:
        """Every store dabuild keeps: the run cache, the trial store and the compiled kernels."""
        from dabuild.ir.kernels.compiling import kernel_dir, kernel_files

        trials = _children(self.trials_root, depth=2)
        kernels = kernel_files()
        return [self.info(),
                StoreInfo(self.trials_root, len(trials), sum(_tree_size(t) for t in trials), "trial store"),
                StoreInfo(kernel_dir(), len(kernels), sum(k.stat().st_size for k in kernels), "compiled kernels")]

    def prune(self, max_size: int) -> tuple[int, int]:
        """Remove every store's temporaries, then its least recently used items (run-cache entries, trial
        contexts, compiled kernels, oldest first across all, each with its `.sig`) until at most
        `max_size` bytes remain.

        Returns (items removed, bytes freed).
        """
        from dabuild.ir.kernels.compiling import kernel_dir, kernel_files, kernel_temporaries, signature_of
        from dabuild.tune.trials import trial_temporaries

        orphans = [signature for signature in [*self._entries.glob("*/*.sig"), *kernel_dir().glob("*.sig")]
                   if not signature.with_suffix("").exists()]  # left beside items an older dabuild removed
        for leftover in [self._tmp, *trial_temporaries(self.trials_root), *kernel_temporaries(), *orphans]:
            _remove_tree(leftover)
        items = [_Item(entry, _tree_size(entry), _mtime(entry / MANIFEST)) for entry in self._all_entries()]
        items += [_Item(context, _tree_size(context), _mtime(context))
                  for context in _children(self.trials_root, depth=2)]
        items += [_Item(kernel, kernel.stat().st_size, _mtime(kernel)) for kernel in kernel_files()]
        total = sum(item.size for item in items)
        removed = freed = 0
        for item in sorted(items, key=lambda item: item.used):
            if total <= max_size:
                break
            _remove_tree(item.path)
            _remove_tree(signature_of(item.path))  # an entry's or a kernel's signature goes with it
            total -= item.size
            removed += 1
            freed += item.size
        return removed, freed


def _children(root: Path, depth: int) -> list[Path]:
    """The folders `depth` levels below `root` (entries sit in two-character shards)."""
    level = [root] if root.is_dir() else []
    for _ in range(depth):
        level = [child for folder in level for child in folder.iterdir() if child.is_dir()]
    return level


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _tree_size(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def _make_writable(function, path, _excinfo) -> None:
    """Read-only files sit in writable folders, so only the folder may need its write bit."""
    os.chmod(os.path.dirname(path), stat.S_IRWXU)
    function(path)


def _remove_tree(root: Path) -> None:
    if root.is_dir() and not root.is_symlink():
        shutil.rmtree(root, onerror=_make_writable)
    elif root.exists() or root.is_symlink():
        root.unlink()
