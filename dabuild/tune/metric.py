"""The score tuning protects: a built-in metric by name, or the user's `file.py:function` / `package.module:function`.

Built in: accuracy and mse (`dabuild.data`), and top-k accuracy as `top_k`
(k = 5) or `top_<k>` such as `top_3`.

A user metric is called as fn(outputs, labels) -> float, higher is better
unless the function carries `higher_is_better = False`. Whatever it does
wrong (fails to import, raises, returns no finite number) is a BuildError
naming it, so a tuning run never records a score it did not really get.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dabuild.data import METRICS
from dabuild.errors import BuildError
from dabuild.recipe import METRIC_FORMS, top_k_of

LOWER_IS_BETTER = frozenset({"mse"})


@dataclass(frozen=True)
class Metric:
    name: str
    function: Callable[[np.ndarray, np.ndarray], float]
    higher_is_better: bool
    file: Path | None = None  # the user's metric file, whose content keys the trial store

    def __call__(self, outputs: np.ndarray, labels: np.ndarray) -> float:
        try:
            value = self.function(np.asarray(outputs), np.asarray(labels))
        except BuildError:
            raise
        except Exception as error:  # the user's function failed: name it, keep the cause
            raise BuildError(f"metric {self.name!r} raised {type(error).__name__}: {error}") from error
        try:
            value = float(value)
        except (TypeError, ValueError):
            raise BuildError(f"metric {self.name!r} returned {type(value).__name__}, not a number") from None
        if not math.isfinite(value):
            raise BuildError(f"metric {self.name!r} returned {value}")
        return value

    def better(self, a: float, b: float) -> bool:
        """Is score `a` strictly better than `b`?"""
        return a > b if self.higher_is_better else a < b

    def identity(self) -> str:
        """What the scores depend on: the name, and the file's bytes for a file metric."""
        if self.file is None:
            return self.name
        return f"{self.name}:{hashlib.sha256(self.file.read_bytes()).hexdigest()}"


def top_k_accuracy(k: int) -> Callable[[np.ndarray, np.ndarray], float]:
    """Share of rows whose integer label is among the k largest outputs (over the last axis).

    Ties rank as a stable descending sort would (the lower class index first),
    the order `argmax` breaks ties in, so `top_1` equals `accuracy` even on
    quantized outputs, where ties are common.
    """
    def top_k(outputs: np.ndarray, labels: np.ndarray) -> float:
        if outputs.shape[:-1] != labels.shape:
            raise BuildError(f"metric top_{k} needs labels of shape {outputs.shape[:-1]} for outputs "
                             f"{outputs.shape}, got {labels.shape}")
        classes = outputs.shape[-1]
        if k >= classes:
            raise BuildError(f"metric top_{k}: the outputs have only {classes} classes, so every sample would "
                             f"count; pick k below {classes}")
        labels = labels.astype(np.int64)
        if labels.size and (labels.min() < 0 or labels.max() >= classes):
            raise BuildError(f"metric top_{k}: labels must be class indices in [0, {classes}), "
                             f"got {labels.min()}..{labels.max()}")
        own = np.take_along_axis(outputs, labels[..., None], axis=-1)
        before = np.arange(classes) < labels[..., None]
        rank = (outputs > own).sum(axis=-1) + ((outputs == own) & before).sum(axis=-1)
        return float(np.mean(rank < k))

    return top_k


def load_metric(spec: str, base_dir: Path | None, file: Path | None = None) -> Metric:
    """The metric a recipe's `data.metric` names; relative files start at `base_dir`.

    `file` is the metric's `.py` as a stage declares it (its content is keyed, its place is not):
    given, it is read instead of the path the spec writes.
    """
    if spec in METRICS:
        return Metric(spec, METRICS[spec], spec not in LOWER_IS_BETTER)
    k = top_k_of(spec)
    if k is not None:
        return Metric(spec, top_k_accuracy(k), True)
    target, colon, attribute = spec.rpartition(":")
    if not colon:
        raise BuildError(f"metric {spec!r}: expected one of {METRIC_FORMS}")
    if not target.endswith(".py"):
        file = None
    elif file is None:
        file = Path(base_dir or Path.cwd(), target)
    try:
        if file is not None:
            module_spec = importlib.util.spec_from_file_location(
                f"dabuild_metric_{hashlib.sha256(str(file).encode()).hexdigest()[:12]}", file)
            if module_spec is None or module_spec.loader is None:
                raise ImportError(f"cannot load {file}")
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
    except Exception as error:
        raise BuildError(f"metric {spec!r}: cannot import {target}: {type(error).__name__}: {error}") from error
    function = getattr(module, attribute, None)
    if not callable(function):
        raise BuildError(f"metric {spec!r}: {target} has no function {attribute!r}")
    return Metric(spec, function, bool(getattr(function, "higher_is_better", True)), file)
