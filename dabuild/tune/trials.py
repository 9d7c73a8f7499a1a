"""Trials: one evaluated config each, kept in the history file and in a store that outlives the build.

The store answers "was this config already scored on this model, calibration,
evaluation data and metric?": its files live under
`<context hash>/<config hash>.json`, where the context hash covers everything
a score depends on besides the config. Raising `max_trials`, re-running after
an interruption, or another strategy on the same model re-evaluates nothing
already seen. Files are written whole and renamed into place, so concurrent
builds and killed runs never leave a half-written score behind.

A record proves itself: it carries its config hash and a sha256 over its
content, checked before its score is used; a record that fails (a flipped
digit, a truncated file, another config's score) is dropped, warned about once,
and the config is evaluated again. A store that cannot be written (full,
read-only) warns once and the search goes on remembering nothing new.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from dabuild import __version__
from dabuild.ir.graph import Graph
from dabuild.notices import warn
from dabuild.quant.config import QuantConfig
from dabuild.trust import TeamKey
from dabuild.tune.evaluate import Score

TRIAL_FORMAT = 3  # bump when what a score means changes (quantize, reference, metric semantics)


@dataclass(frozen=True)
class Trial:
    index: int
    config: QuantConfig
    config_hash: str
    metric: float
    mse: float
    size: int  # weight bits
    bops: int
    cost: int  # by the recipe's objective
    passed: bool
    seconds: float  # time the evaluation took when it was first made
    cached: bool  # score read from the trial store, not evaluated in this run
    step: str  # which phase of the strategy proposed it
    stopped: bool = False  # scored on part of the data: `metric` is a bound that already missed the goal

    def to_json(self) -> dict[str, Any]:
        return {
            "trial": self.index,
            "config_hash": self.config_hash,
            "metric": self.metric,
            "mse": self.mse,
            "size_bits": self.size,
            "bops": self.bops,
            "cost": self.cost,
            "passed": self.passed,
            "seconds": round(self.seconds, 6),
            "cached": self.cached,
            "step": self.step,
            "stopped": self.stopped,
            "config": describe_config(self.config),
        }


def describe_config(config: QuantConfig) -> dict[str, str]:
    """node -> `w:int8/sym/per_tensor/minmax a:int8/asym/per_tensor/minmax`, or `fp32`."""
    def role(prefix: str, choice: Any) -> str:
        return f"{prefix}:{choice.dtype}/{choice.scheme}/{choice.granularity}/{choice.algorithm}" if choice else ""

    return {name: " ".join(filter(None, (role("w", c.weight), role("a", c.activation)))) or "fp32"
            for name, c in config.nodes.items()}


def _array_hash(array: np.ndarray) -> str:
    """sha256 of the dtype, shape and bytes, hashed in place (the evaluation images are no copy of themselves)."""
    array = np.ascontiguousarray(array)
    digest = hashlib.sha256(f"{array.dtype}{array.shape}".encode())
    digest.update(array.reshape(-1).data.cast("B"))
    return digest.hexdigest()


def _file_hash(path: Path) -> str:
    """sha256 of the file, read in chunks: the calibration statistics (0.5 GB for ResNet-50) are never whole in memory."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def context_hash(graph: Graph, stats_file: Path, x: np.ndarray, labels: np.ndarray, metric_identity: str,
                 bias_correction: bool = False, integer_writers: frozenset[str] = frozenset()) -> str:
    """Everything a trial's score depends on except the config itself."""
    parts = {
        "format": TRIAL_FORMAT,
        "dabuild": __version__,
        "graph": graph.content_hash(),
        "names": [[node.name, *node.outputs] for node in graph.nodes],
        "stats": _file_hash(Path(stats_file)),
        "x": _array_hash(x),
        "labels": _array_hash(labels),
        "metric": metric_identity,
        "bias_correction": bias_correction,
        "integer_writers": sorted(integer_writers),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


TEMPORARY_PREFIX = ".trial-"


def _proof(record: dict[str, Any], key: TeamKey | None) -> str:
    """The record's hash; in a cache others may write, its team-key signature (a hash anyone can forge)."""
    if key is not None:
        return key.sign("trial", record)
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


class SharedTrials(Protocol):
    """The team's remote trial store (dabuild/pipeline/remote.py): signed records, checked before they return."""

    def get_trial(self, context: str, config_hash: str) -> dict[str, Any] | None: ...

    def put_trial(self, context: str, config_hash: str, score: dict[str, Any]) -> None: ...


class TrialStore:
    """Scores by config hash within one context; a store without a root remembers nothing (--no-cache).

    With `shared` (the team's remote), a score this store lacks is looked up there, and every new score is
    also pushed there: a second machine's search evaluates nothing the first one scored. With `key` (a run
    cache that others may write, dabuild/trust.py), records are signed with the team key and one without a
    valid signature is dropped like a damaged one: a forged score would steer the search.
    """

    def __init__(self, root: Path | None, context: str, shared: SharedTrials | None = None,
                 key: TeamKey | None = None):
        self.folder = None if root is None else Path(root) / context[:2] / context
        self.context = context
        self.shared = shared if root is not None else None
        self.key = key
        self.writable = True  # until a write fails

    def get(self, config_hash: str, floor: float | None = None) -> Score | None:
        """The stored score of `config_hash`, or None when absent or when the record fails its proof; a
        stopped score (an upper bound) only while it still misses `floor`."""
        if self.folder is None:
            return None
        path = self.folder / f"{config_hash}.json"
        try:
            text = path.read_text()
        except OSError:
            return self._shared_score(config_hash, floor)  # absent here: the team's, else evaluate
        try:
            data = json.loads(text)
            proof = data.pop("proof")
            if not hmac.compare_digest(str(proof), _proof(data, self.key)) or data["config_hash"] != config_hash:
                raise ValueError("not signed by the team key" if self.key else "its content does not match its hash")
            score = _score(data)
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            warn(f"trial store record {path} is damaged ({error}); dropped, the config is evaluated again",
                 key=str(path))
            path.unlink(missing_ok=True)
            return None
        try:
            os.utime(self.folder)  # the context's last use, for `dabuild cache prune`
        except OSError:
            pass
        return _deciding(score, floor)

    def _shared_score(self, config_hash: str, floor: float | None) -> Score | None:
        if self.shared is None:
            return None
        data = self.shared.get_trial(self.context, config_hash)
        try:
            if data is None or data["config_hash"] != config_hash:
                return None
            score = _score(data)
        except (ValueError, KeyError, TypeError, AttributeError):
            return None
        self._write(config_hash, score)
        return _deciding(score, floor)

    def put(self, config_hash: str, score: Score) -> None:
        if self.folder is None:
            return
        self._write(config_hash, score)
        if self.shared is not None:
            self.shared.put_trial(self.context, config_hash, _record(config_hash, score))

    def _write(self, config_hash: str, score: Score) -> None:
        if self.folder is None or not self.writable:
            return
        record = _record(config_hash, score)
        record["proof"] = _proof(record, self.key)
        tmp: str | None = None
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            handle, tmp = tempfile.mkstemp(prefix=TEMPORARY_PREFIX, dir=self.folder)
            with os.fdopen(handle, "w") as stream:
                stream.write(json.dumps(record))
            os.replace(tmp, self.folder / f"{config_hash}.json")
        except OSError as error:
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)
            warn(f"the trial store {self.folder.parent.parent} cannot be written ({error.strerror or error}); "
                 "tuning goes on without remembering its scores")
            self.writable = False


def _record(config_hash: str, score: Score) -> dict[str, Any]:
    return {"config_hash": config_hash, "metric": score.metric, "mse": score.mse, "seconds": score.seconds,
            "stopped": score.stopped}


def _score(data: dict[str, Any]) -> Score:
    return Score(float(data["metric"]), float(data["mse"]), float(data["seconds"]), bool(data["stopped"]))


def _deciding(score: Score, floor: float | None) -> Score | None:
    """A stopped score (an upper bound) only while it still misses `floor`; else evaluate in full."""
    if score.stopped and (floor is None or score.metric >= floor):
        return None
    return score


def trial_temporaries(root: Path) -> list[Path]:
    """Half-written records that killed runs left in the store at `root`, for `dabuild cache prune`."""
    return sorted(Path(root).glob(f"*/*/{TEMPORARY_PREFIX}*")) if Path(root).is_dir() else []
