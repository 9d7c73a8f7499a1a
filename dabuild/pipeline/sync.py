"""`dabuild cache push | pull | status`: a recipe's entries between the local store and the team's remote.

Keys are found the way a build finds them, in plan order: a stage's key needs
its inputs' digests, which come from the entry found for each input (locally,
or in the remote). `pull` therefore fetches exactly the entries the requested
targets need, and no more; `push` uploads the entries a build folder holds.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from dabuild.pipeline.execute import Workspace
from dabuild.pipeline.manifest import Manifest
from dabuild.pipeline.plan import Stage, cache_key, key_parts
from dabuild.pipeline.store import Store


@dataclass(frozen=True)
class EntryState:
    stage: str
    key: str | None  # None: an input's entry is nowhere, so this key is not known yet
    local: bool
    remote: bool


def push(stages: list[Stage], workspace: Workspace, store: Store) -> tuple[int, int]:
    """Upload the entry of every stage the build folder holds; (pushed or already there, without an entry)."""
    pushed = missing = 0
    for stage in stages:
        manifest = Manifest.read(workspace.stage_dir(stage.name))
        if manifest is not None and store.push(manifest.key):
            pushed += 1
        else:
            missing += 1
    return pushed, missing


def walk(stages: list[Stage], store: Store, pull: bool) -> list[EntryState]:
    """Each stage's key and where its entry is; with `pull`, fetch the ones only the remote has."""
    digests: dict[str, str] = {}
    states = []
    for stage in stages:
        if any(upstream not in digests for upstream in stage.inputs.values()):
            states.append(EntryState(stage.name, None, False, False))
            continue
        key = cache_key(key_parts(stage, {role: digests[up] for role, up in stage.inputs.items()}))
        local = store.lookup(key)
        remote = store.remote is not None and store.remote.has(key)
        if local is None and remote and pull:
            local = _fetch(store, key)
        if local is not None:
            digests[stage.name] = local.digest
        elif remote and store.remote is not None:
            found = _peek(store, key)
            if found is not None:
                digests[stage.name] = found.digest
        states.append(EntryState(stage.name, key, local is not None, remote))
    return states


def _fetch(store: Store, key: str) -> Manifest | None:
    scratch = Path(tempfile.mkdtemp(prefix="dabuild-pull-"))
    try:
        return store.restore_remote(key, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _peek(store: Store, key: str) -> Manifest | None:
    """The remote entry's manifest, signature checked, without its blobs (for `status`)."""
    assert store.remote is not None
    return store.remote.manifest(key)
