"""The run cache on its own: entries, verification, corruption and pruning."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dabuild.pipeline.hashing import hash_value
from dabuild.pipeline.manifest import Manifest
from dabuild.pipeline.store import Store


def _stage_folder(root: Path, content: bytes = b"weights") -> Path:
    folder = root / "out"
    (folder / "sub").mkdir(parents=True)
    (folder / "graph.json").write_text('{"nodes": []}')
    (folder / "sub" / "weights.bin").write_bytes(content)
    return folder


def _stored(tmp_path: Path, config: int = 1, content: bytes = b"weights") -> tuple[Store, Manifest]:
    store = Store(tmp_path / "cache")
    parts = {"config": config}
    key = hash_value(parts)
    folder = _stage_folder(tmp_path / key[:4], content)
    manifest = Manifest.of_folder(folder, "trace", key, parts)
    store.save(folder, manifest)
    return store, manifest


def test_restore_reproduces_files_and_manifest(tmp_path: Path) -> None:
    store, manifest = _stored(tmp_path)
    dest = tmp_path / "restored"
    dest.mkdir()
    restored = store.restore(manifest.key, dest)
    assert restored == manifest
    assert (dest / "sub" / "weights.bin").read_bytes() == b"weights"
    assert Manifest.of_folder(dest, "trace", manifest.key, manifest.parts).files == manifest.files


def test_stored_files_are_read_only(tmp_path: Path) -> None:
    store, manifest = _stored(tmp_path)
    entry = store.root / "entries" / manifest.key[:2] / manifest.key
    assert (entry / "graph.json").stat().st_mode & 0o222 == 0


def test_corrupted_entry_is_detected_and_dropped(tmp_path: Path) -> None:
    store, manifest = _stored(tmp_path)
    stored_file = store.root / "entries" / manifest.key[:2] / manifest.key / "sub" / "weights.bin"
    stored_file.chmod(0o644)
    stored_file.write_bytes(b"weightz")  # same size, other content
    dest = tmp_path / "restored"
    dest.mkdir()
    assert store.restore(manifest.key, dest) is None
    assert store.lookup(manifest.key) is None
    assert store.info().entries == 0


def test_partial_entry_without_manifest_is_ignored_and_replaced(tmp_path: Path) -> None:
    store = Store(tmp_path / "cache")
    key = hash_value({})
    partial = store.root / "entries" / key[:2] / key
    partial.mkdir(parents=True)
    (partial / "graph.json").write_text("half")
    assert store.lookup(key) is None
    folder = _stage_folder(tmp_path / "src")
    manifest = Manifest.of_folder(folder, "trace", key, {})
    store.save(folder, manifest)
    assert store.lookup(key) == manifest
    assert (partial / "graph.json").read_text() == '{"nodes": []}'


def test_missing_file_in_entry_fails_verification(tmp_path: Path) -> None:
    store, manifest = _stored(tmp_path)
    (store.root / "entries" / manifest.key[:2] / manifest.key / "graph.json").unlink()
    dest = tmp_path / "restored"
    dest.mkdir()
    assert store.restore(manifest.key, dest) is None


@pytest.fixture
def kernels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A kernel cache of the test's own: prune covers it, and must not empty the user's."""
    folder = tmp_path / "kernels"
    monkeypatch.setenv("DABUILD_KERNEL_CACHE", str(folder))
    return folder


def test_prune_drops_least_recently_used_first(tmp_path: Path, kernels: Path) -> None:
    keys = [hash_value({"config": n}) for n in range(3)]
    store = Store(tmp_path / "cache")
    for age, key in enumerate(keys):
        _, _manifest = _stored(tmp_path, age, content=b"x" * 1000)
        entry_manifest = store.root / "entries" / key[:2] / key / ".manifest.json"
        os.utime(entry_manifest, (1_000_000 + age, 1_000_000 + age))
    # using the oldest entry makes it the most recently used
    dest = tmp_path / "use"
    dest.mkdir()
    assert store.restore(keys[0], dest) is not None
    one_entry = store.info().size // 3
    removed, freed = store.prune(max_size=one_entry)
    assert removed == 2 and freed > 0
    assert store.lookup(keys[0]) is not None
    assert store.lookup(keys[1]) is None and store.lookup(keys[2]) is None


def test_prune_to_zero_empties_the_store(tmp_path: Path, kernels: Path) -> None:
    store, _ = _stored(tmp_path)
    store.prune(0)
    assert store.info().entries == 0


def test_max_size_rejects_garbage_naming_the_option() -> None:
    from dabuild.cli import max_size
    from dabuild.errors import UsageError

    assert max_size("500M") == 500 * 1024**2
    with pytest.raises(UsageError, match="--max-size: 'lots' is not a size"):
        max_size("lots")


def test_prune_removes_the_signatures_beside_what_it_removes(tmp_path: Path, kernels: Path) -> None:
    from dabuild.trust import TeamKey

    store = Store(tmp_path / "cache", key=TeamKey(b"a team key of 32 bytes, at least", "test"))
    folder = _stage_folder(tmp_path / "src")
    manifest = Manifest.of_folder(folder, "trace", hash_value({}), {})
    store.save(folder, manifest)
    signature = store.root / "entries" / manifest.key[:2] / f"{manifest.key}.sig"
    assert signature.is_file()
    kernels.mkdir()
    (kernels / "conv.0123.so").write_bytes(b"\x7fELF")
    (kernels / "conv.0123.so.sig").write_text("signature\n")
    (kernels / "gone.4567.so.sig").write_text("left by an older prune\n")
    orphan = signature.with_name("ab" * 32 + ".sig")
    orphan.write_text("left by an older prune\n")
    store.prune(0)
    assert store.info().entries == 0
    assert sorted(p.name for p in store.root.rglob("*.sig")) == [] and list(kernels.iterdir()) == []
