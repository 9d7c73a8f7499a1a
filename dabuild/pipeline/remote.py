"""A team's remote cache, as Bazel's is: an action cache over a content-addressed store, through fsspec.

Layout under the remote's URL:

    v1/cas/<sha[:2]>/<sha256>                 one blob: a stage output file, stored once whoever made it
    v1/ac/<key[:2]>/<stage key>.json          {"manifest": ..., "signature": HMAC-SHA256 by the team key}
    v1/trials/<ctx[:2]>/<ctx>/<config>.json   one signed trial score (the shared trial store)

A push writes every blob first and the action-cache record last, so a reader
never finds a record whose blobs are missing. Uploads are idempotent (a blob or
record already there is skipped; identical keys carry identical bytes), and
each file is written under a temporary name and renamed (S3's single PUT is
already atomic), so two builds pushing the same keys at once leave a consistent
remote. A fetch verifies the record's signature, then re-hashes every blob while
downloading it; anything that fails is ignored with one warning and rebuilt.

A remote never fails a build: any error (unreachable host, timeout, bad
credentials, a missing fsspec backend) is one warning naming the remote, and the
build goes on with the local cache alone. Connections time out in seconds.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

from dabuild.notices import warn
from dabuild.pipeline.hashing import canonical_json, hash_value
from dabuild.pipeline.manifest import Manifest
from dabuild.pipeline.remote_settings import PROTOCOL_EXTRAS, RemoteSettings
from dabuild.trust import TeamKey

LAYOUT = "v1"
CONNECT_SECONDS = 10
READ_SECONDS = 60
MAX_RECORD_BYTES = 16 * 1024**2  # an action-cache record or trial score; blobs are bounded by their manifest
_CHUNK = 1 << 20


class RemoteFailure(Exception):
    """The remote cannot be used for the rest of this build (the message says why, for the user)."""


class Remote:
    """One remote cache; every method degrades to "not found" / "not pushed" once the remote has failed."""

    def __init__(self, settings: RemoteSettings, key: TeamKey):
        self.settings = settings
        self.key = key
        self.url = settings.url
        self.failed = False
        self.bytes_pulled = 0
        self.bytes_pushed = 0
        self._filesystem: Any = None
        self._root = root_path(settings.url)

    # -- reading -------------------------------------------------------------------------------------

    def fetch(self, key: str, dest: Path) -> Manifest | None:
        """Download the entry for `key` into the empty folder `dest`, verified; None on a miss or a bad entry."""
        manifest = self.manifest(key)
        if manifest is None:
            return None
        with self._guard():
            for name, info in manifest.files.items():
                if not self._download(self._cas_path(info["sha256"]), dest / name, info):
                    self._reject(key, f"has a blob for {name} that does not match its hash")
                    return None
            return manifest
        return None

    def manifest(self, key: str) -> Manifest | None:
        """The signed manifest of the entry for `key` (its blobs not fetched), or None."""
        with self._guard():
            record = self._read_record(self._ac_path(key))
            return None if record is None else self._trusted_manifest(key, record)
        return None

    def has(self, key: str) -> bool:
        with self._guard():
            return bool(self._fs().exists(self._ac_path(key)))
        return False

    def get_trial(self, context: str, config_hash: str) -> dict[str, Any] | None:
        """A signed trial score record, or None."""
        with self._guard():
            record = self._read_record(self._trial_path(context, config_hash))
            if record is None:
                return None
            score = record.get("score")
            if not self.key.verifies("trial", score, record.get("signature")):
                warn(f"remote {self.url}: trial {config_hash[:12]} is not signed by the team key; ignored",
                     key=f"remote trial {config_hash}")
                return None
            return score if isinstance(score, dict) else None
        return None

    # -- writing -------------------------------------------------------------------------------------

    def push(self, folder: Path, manifest: Manifest) -> bool:
        """Upload a verified entry (blobs first, record last); True when the remote now holds it."""
        if not self.settings.push:
            return False
        with self._guard():
            fs = self._fs()
            ac = self._ac_path(manifest.key)
            if fs.exists(ac):
                return True
            for name, info in manifest.files.items():
                blob = self._cas_path(info["sha256"])
                if not fs.exists(blob):
                    self._put(folder / name, blob)
                    self.bytes_pushed += info["size"]
            body = asdict(manifest)
            self._put_bytes(canonical_json({"manifest": body, "signature": self.key.sign("manifest", body)}), ac)
            return True
        return False

    def put_trial(self, context: str, config_hash: str, score: dict[str, Any]) -> None:
        if not self.settings.push:
            return
        with self._guard():
            path = self._trial_path(context, config_hash)
            if not self._fs().exists(path):
                self._put_bytes(canonical_json({"score": score, "signature": self.key.sign("trial", score)}), path)

    # -- the pieces ----------------------------------------------------------------------------------

    def _trusted_manifest(self, key: str, record: dict[str, Any]) -> Manifest | None:
        body = record.get("manifest")
        if not self.key.verifies("manifest", body, record.get("signature")):
            self._reject(key, "is not signed by the team key")
            return None
        try:
            assert isinstance(body, dict)
            manifest = Manifest(body["stage"], body["key"], body["files"], body.get("parts", {}))
            sound = (manifest.key == key and hash_value(manifest.parts) == key
                     and all(_safe_name(name) and _blob_info(info) for name, info in manifest.files.items()))
        except (AssertionError, KeyError, TypeError, AttributeError):
            sound = False
        if not sound:
            self._reject(key, "has a manifest that does not describe its key")
            return None
        return manifest

    def _reject(self, key: str, problem: str) -> None:
        warn(f"remote {self.url}: entry {key[:12]} {problem}; ignored, the stage runs again",
             key=f"remote entry {key}")

    def _read_record(self, path: str) -> dict[str, Any] | None:
        fs = self._fs()
        try:
            with fs.open(path, "rb") as stream:
                data = stream.read(MAX_RECORD_BYTES + 1)
        except FileNotFoundError:
            return None
        if len(data) > MAX_RECORD_BYTES:
            return None
        self.bytes_pulled += len(data)
        try:
            record = json.loads(data)
        except ValueError:
            return None
        return record if isinstance(record, dict) else None

    def _download(self, path: str, target: Path, info: dict[str, Any]) -> bool:
        """Stream one blob to `target`, hashing it; False when it is missing, too long or not the blob named."""
        target.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256()
        size = 0
        try:
            with self._fs().open(path, "rb") as stream, open(target, "wb") as out:
                while chunk := stream.read(_CHUNK):
                    size += len(chunk)
                    if size > info["size"]:
                        return False
                    digest.update(chunk)
                    out.write(chunk)
        except FileNotFoundError:
            return False
        self.bytes_pulled += size
        return size == info["size"] and digest.hexdigest() == info["sha256"]

    def _put(self, local: Path, path: str) -> None:
        fs = self._fs()
        if _atomic_puts(fs):
            fs.put_file(str(local), path)
            return
        partial = self._partial_path()
        fs.makedirs(posixpath.dirname(partial), exist_ok=True)
        fs.put_file(str(local), partial)
        self._rename(partial, path)

    def _put_bytes(self, text: str, path: str) -> None:
        fs = self._fs()
        if _atomic_puts(fs):
            fs.pipe_file(path, text.encode())
            return
        partial = self._partial_path()
        fs.makedirs(posixpath.dirname(partial), exist_ok=True)
        fs.pipe_file(partial, text.encode())
        self._rename(partial, path)

    def _rename(self, partial: str, path: str) -> None:
        """Move into place; another writer's identical file already there is as good as ours."""
        fs = self._fs()
        fs.makedirs(posixpath.dirname(path), exist_ok=True)
        try:
            fs.mv(partial, path)
        except OSError:
            if not fs.exists(path):
                raise
            fs.rm(partial)

    def _partial_path(self) -> str:
        return f"{self._root}/{LAYOUT}/tmp/{uuid.uuid4().hex}"

    def _ac_path(self, key: str) -> str:
        return f"{self._root}/{LAYOUT}/ac/{key[:2]}/{key}.json"

    def _cas_path(self, sha: str) -> str:
        return f"{self._root}/{LAYOUT}/cas/{sha[:2]}/{sha}"

    def _trial_path(self, context: str, config_hash: str) -> str:
        return f"{self._root}/{LAYOUT}/trials/{context[:2]}/{context}/{config_hash}.json"

    def _fs(self) -> Any:
        if self.failed:
            raise RemoteFailure("failed before")
        if self._filesystem is None:
            self._filesystem = open_filesystem(self.url)
        return self._filesystem

    @contextmanager
    def _guard(self) -> Iterator[None]:
        """Turn any failure of the remote into one warning and a local-only build.

        A broad catch is deliberate: fsspec backends raise their transport's own errors (asyncssh,
        botocore, aiohttp), and none of them may fail a build.
        """
        try:
            yield
        except Exception as error:  # noqa: BLE001 - the network boundary: see the docstring
            if self.failed:
                return  # warned when it first failed
            self.failed = True
            warn(f"remote {self.url} ({self.settings.source}): {describe_failure(error)}; "
                 "building with the local cache only", key=f"remote {self.url}")


def root_path(url: str) -> str:
    """The remote's folder inside its filesystem (for S3: `bucket/prefix`)."""
    parts = urlsplit(url)
    if parts.scheme == "s3":
        return f"{parts.netloc}{parts.path}".rstrip("/")
    return parts.path.rstrip("/")


def open_filesystem(url: str) -> Any:
    """The fsspec filesystem for `url`, with bounded timeouts (connecting, for SFTP)."""
    parts = urlsplit(url)
    protocol = parts.scheme
    try:
        if protocol == "file":
            from fsspec.implementations.local import LocalFileSystem

            return LocalFileSystem()
        if protocol in ("sftp", "ssh"):
            from sshfs import SSHFileSystem

            options: dict[str, Any] = {"port": parts.port or 22, "connect_timeout": CONNECT_SECONDS,
                                       "login_timeout": CONNECT_SECONDS}
            if parts.username:
                options["username"] = parts.username
            return SSHFileSystem(parts.hostname, skip_instance_cache=True, **options)
        if protocol == "s3":
            from s3fs import S3FileSystem

            config = {"connect_timeout": CONNECT_SECONDS, "read_timeout": READ_SECONDS,
                      "retries": {"max_attempts": 2}}
            return S3FileSystem(skip_instance_cache=True, config_kwargs=config)
    except ImportError:
        raise RemoteFailure(f"its protocol needs `pip install 'dabuild[{PROTOCOL_EXTRAS[protocol]}]'`") from None
    raise RemoteFailure(f"unknown protocol {protocol!r}")


def describe_failure(error: BaseException) -> str:
    """One line a user can act on: bad credentials, unreachable, or what failed."""
    if isinstance(error, RemoteFailure):
        return str(error)
    name = type(error).__name__
    text = str(error).strip().splitlines()[0] if str(error).strip() else name
    if isinstance(error, PermissionError) or name in ("PermissionDenied", "NoCredentialsError",
                                                       "PartialCredentialsError"):
        return f"access denied, check the credentials for it ({text})"
    if isinstance(error, TimeoutError) or "timeout" in name.lower() or "timed out" in text.lower():
        return f"no answer within {CONNECT_SECONDS}s ({text})"
    if isinstance(error, ConnectionError | OSError):
        return f"unreachable ({text})"
    return f"failed ({name}: {text})"


def _atomic_puts(filesystem: Any) -> bool:
    """Object stores replace an object in one PUT; filesystems need a temporary name and a rename."""
    protocols = filesystem.protocol if isinstance(filesystem.protocol, tuple) else (filesystem.protocol,)
    return any(p in ("s3", "s3a", "gs", "gcs") for p in protocols)


def _safe_name(name: object) -> bool:
    """A manifest's file name stays inside its folder: relative, no `..`, no empty parts."""
    if not isinstance(name, str) or not name or "\\" in name or "\0" in name:
        return False
    path = PurePosixPath(name)
    return not path.is_absolute() and all(part not in ("", ".", "..") for part in name.split("/"))


def _blob_info(info: object) -> bool:
    return (isinstance(info, dict) and isinstance(info.get("sha256"), str) and len(info["sha256"]) == 64
            and all(c in "0123456789abcdef" for c in info["sha256"])
            and isinstance(info.get("size"), int) and info["size"] >= 0)
