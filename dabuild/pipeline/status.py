"""What a build would do, stage by stage, and why: the answer of `dabuild list`.

Each stage is up to date (its folder carries the key it would be built under),
cached (the store has that key), or stale with a reason read off the difference
between the key parts recorded in its manifest and the current ones.
"""

from __future__ import annotations

from dataclasses import dataclass

from dabuild.pipeline.execute import Workspace
from dabuild.pipeline.manifest import Manifest
from dabuild.pipeline.plan import Stage, cache_key, input_digests, key_parts
from dabuild.pipeline.store import Store

_PART_NAMES = {
    "code": "the code it runs changed",
    "dabuild": "dabuild version changed",
    "config": "recipe settings changed",
    "packages": "package versions changed",
    "tools": "tool versions changed",
}


@dataclass(frozen=True)
class StageStatus:
    name: str
    state: str      # "up to date" | "cached" | "stale"
    reason: str


def statuses(stages: list[Stage], workspace: Workspace, store: Store | None) -> list[StageStatus]:
    manifests: dict[str, Manifest] = {}
    result = []
    for stage in stages:
        pending = [up for up in stage.inputs.values() if up not in manifests]
        if pending:
            result.append(StageStatus(stage.name, "stale", f"input {pending[0]} will be rebuilt"))
            continue
        parts = key_parts(stage, input_digests(stage, {role: manifests[up] for role, up in stage.inputs.items()}))
        key = cache_key(parts)
        folder = workspace.stage_dir(stage.name)
        current = Manifest.read(folder)
        if current is not None and current.key == key and current.matches(folder, deep=False):
            manifests[stage.name] = current
            result.append(StageStatus(stage.name, "up to date", ""))
            continue
        stored = store.lookup(key) if store is not None else None
        if stored is not None:
            manifests[stage.name] = stored
            result.append(StageStatus(stage.name, "cached", "an identical earlier result is in the cache"))
            continue
        result.append(StageStatus(stage.name, "stale", _why(current, parts, folder)))
    return result


def _why(current: Manifest | None, parts: dict, folder) -> str:
    if current is None:
        return "not built yet"
    old = current.parts
    if old.get("inputs") != parts["inputs"]:
        changed = [r for r in parts["inputs"] if old.get("inputs", {}).get(r) != parts["inputs"][r]]
        return f"input {', '.join(changed)} changed"
    if old.get("files") != parts["files"]:
        changed = [r for r in parts["files"] if old.get("files", {}).get(r) != parts["files"][r]]
        return f"file {', '.join(changed) or 'list'} changed"
    for part, reason in _PART_NAMES.items():
        if old.get(part) != parts.get(part):
            return reason
    return "outputs were modified or removed"
