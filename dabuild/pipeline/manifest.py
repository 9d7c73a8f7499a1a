"""The manifest that marks a stage folder (or a cache entry) as complete and verifiable.

A folder without a manifest is never trusted: stages write the manifest last, in
a temporary folder, before renaming the folder into place. The manifest is
deterministic (no timestamps), so restoring an entry reproduces it byte for byte
and doit sees downstream inputs unchanged.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dabuild.pipeline.hashing import canonical_json, hash_tree, hash_value

MANIFEST = ".manifest.json"


@dataclass(frozen=True)
class Manifest:
    stage: str                      # stage kind: trace, calibrate, tune, export, check
    key: str                        # the cache key the outputs were produced under
    files: dict[str, dict[str, Any]]
    parts: dict[str, Any] = field(default_factory=dict)   # key components, to explain staleness

    @property
    def digest(self) -> str:
        """Identity of the outputs' content: what downstream keys depend on."""
        return hash_value(self.files)

    def digest_of(self, folder: str | None) -> str:
        """Identity of the files below `folder` (a relative path; None: of all the outputs)."""
        if folder is None:
            return self.digest
        prefix = folder.rstrip("/") + "/"
        return hash_value({name[len(prefix):]: info for name, info in self.files.items() if name.startswith(prefix)})

    @classmethod
    def of_folder(cls, folder: Path, stage: str, key: str, parts: dict[str, Any]) -> Manifest:
        return cls(stage, key, hash_tree(folder, exclude=frozenset({MANIFEST})), parts)

    def write(self, folder: Path) -> None:
        (folder / MANIFEST).write_text(canonical_json(asdict(self)) + "\n")

    @classmethod
    def read(cls, folder: Path) -> Manifest | None:
        """The folder's manifest, or None when it is missing or unreadable."""
        try:
            data = json.loads((folder / MANIFEST).read_text())
            return cls(data["stage"], data["key"], data["files"], data.get("parts", {}))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def matches(self, folder: Path, deep: bool) -> bool:
        """Do the folder's files still match? `deep` re-hashes, otherwise sizes are compared."""
        if deep:
            return hash_tree(folder, exclude=frozenset({MANIFEST})) == self.files
        for name, info in self.files.items():
            try:
                if (folder / name).stat().st_size != info["size"]:
                    return False
            except OSError:
                return False
        return True
