"""Where a team's remote cache is and how this user may use it.

Read from, in order (the first that names a remote wins; `push` and `key_file`
come from the same place):

1. the environment: `DABUILD_REMOTE=<url>`, `DABUILD_NO_PUSH=1`;
2. the project file `dabuild-cache.yaml` in the recipe's folder or the nearest
   folder above it (committed beside the recipes, so a clone finds the remote);
3. the user file `<user config dir>/dabuild/cache.yaml` (a laptop's own choice).

A file holds `remote: <url>`, optionally `push: false` (read-only: CI consumers,
laptops) and `key_file: <path>` (relative to the file) holding the team key.
A bad URL or an unknown protocol is a validation error at its line.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from dabuild.errors import Diagnostic, ValidationError
from dabuild.yamlpos import load_yaml

REMOTE_ENV = "DABUILD_REMOTE"
NO_PUSH_ENV = "DABUILD_NO_PUSH"
PROJECT_FILE = "dabuild-cache.yaml"
USER_FILE = "cache.yaml"
# protocol -> the pip extra that installs its fsspec backend
PROTOCOL_EXTRAS = {"file": "remote", "s3": "s3", "sftp": "sftp", "ssh": "sftp"}
_KEYS = ("remote", "push", "key_file")


@dataclass(frozen=True)
class RemoteSettings:
    url: str
    push: bool
    key_file: Path | None
    source: str  # where the URL was given: shown in every message about the remote


def url_problem(url: str) -> str | None:
    """Why `url` cannot name a remote, or None."""
    supported = ", ".join(f"{p}://" for p in sorted(PROTOCOL_EXTRAS))
    parts = urlsplit(url)
    if not parts.scheme or "://" not in url:
        return f"{url!r} is not a URL; supported: {supported}"
    if parts.scheme not in PROTOCOL_EXTRAS:
        return f"unknown remote protocol {parts.scheme!r} in {url!r}; supported: {supported}"
    if parts.scheme == "file" and (parts.netloc or not parts.path.startswith("/")):
        return f"{url!r}: a file:// remote needs an absolute path, e.g. file:///mnt/team/cache"
    if parts.scheme != "file" and not parts.hostname:
        where = "bucket" if parts.scheme == "s3" else "host"
        return f"{url!r} names no {where}, e.g. {parts.scheme}://{where}/path"
    return None


def load_settings(start: Path | None = None, no_push: bool = False) -> RemoteSettings | None:
    """The remote for a build of a recipe in `start` (a folder), or None when none is configured."""
    url = os.environ.get(REMOTE_ENV, "").strip()
    settings: RemoteSettings | None
    if url:
        problem = url_problem(url)
        if problem:
            raise ValidationError([Diagnostic(f"${REMOTE_ENV}", None, None, problem)])
        files = [s for s in map(_read, _config_files(start)) if s is not None]
        key_file = next((s.key_file for s in files if s.key_file is not None), None)  # a key file from a file
        settings = RemoteSettings(url, True, key_file, f"${REMOTE_ENV}")
    else:
        settings = next((s for s in map(_read, _config_files(start)) if s is not None and s.url), None)
    if settings is None:
        return None
    if no_push or os.environ.get(NO_PUSH_ENV, "") not in ("", "0"):
        settings = RemoteSettings(settings.url, False, settings.key_file, settings.source)
    return settings


def _config_files(start: Path | None) -> list[Path]:
    from platformdirs import user_config_dir

    files = []
    if start is not None:
        folder = start.resolve()
        for candidate in (folder, *folder.parents):
            if (candidate / PROJECT_FILE).is_file():
                files.append(candidate / PROJECT_FILE)
                break
    user = Path(user_config_dir("dabuild")) / USER_FILE
    if user.is_file():
        files.append(user)
    return files


def _read(file: Path) -> RemoteSettings | None:
    document = load_yaml(file)
    data = document.data
    if data is None:
        return None
    problems = []
    if not isinstance(data, dict):
        raise ValidationError([document.diagnostic((), "expected a mapping with `remote: <url>`")])
    for key in data:
        if key not in _KEYS:
            problems.append(document.diagnostic((key,), f"unknown key {key!r}; expected one of: "
                                                       f"{', '.join(_KEYS)}", key=True))
    url, push, key_file = data.get("remote"), data.get("push", True), data.get("key_file")
    if url is not None and (not isinstance(url, str) or url_problem(url)):
        problems.append(document.diagnostic(("remote",), url_problem(str(url)) or "expected a URL string"))
    if not isinstance(push, bool):
        problems.append(document.diagnostic(("push",), "expected true or false"))
    if key_file is not None and not isinstance(key_file, str):
        problems.append(document.diagnostic(("key_file",), "expected a path"))
    if problems:
        raise ValidationError(problems)
    key_path = (file.parent / Path(key_file).expanduser()) if key_file else None
    return RemoteSettings(url or "", push, key_path, str(file))
