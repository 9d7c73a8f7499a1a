"""The score tuning protects: a built-in metric by name, or the user's `file.py:function` / `package.module:function`.

The built-in ones, by name, are dabuild.metrics'; this module loads any of them
or the user's function as the `Metric` tuning and check score with.

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

from dabuild.errors import BuildError
from dabuild.metrics import BUILT_IN, LOWER_IS_BETTER, METRIC_FORMS, top_k_accuracy, top_k_of


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

    @property
    def counts_samples(self) -> bool:
        """Whether the metric is the share of samples it calls right (accuracy, top_k), each worth 1/n."""
        return self.file is None and (self.name == "accuracy" or top_k_of(self.name) is not None)

    def better(self, a: float, b: float) -> bool:
        """Is score `a` strictly better than `b`?"""
        return a > b if self.higher_is_better else a < b

    def identity(self) -> str:
        """What the scores depend on: the name, and the file's bytes for a file metric."""
        if self.file is None:
            return self.name
        return f"{self.name}:{hashlib.sha256(self.file.read_bytes()).hexdigest()}"


def load_metric(spec: str, file: Path | None = None) -> Metric:
    """The metric a recipe's `data.metric` names; a file it names is taken as written.

    `file` is the metric's `.py` as a stage declares it (its content is keyed, its place is not):
    given, it is read instead of the path the spec writes.
    """
    if spec in BUILT_IN:
        return Metric(spec, BUILT_IN[spec], spec not in LOWER_IS_BETTER)
    k = top_k_of(spec)
    if k is not None:
        return Metric(spec, top_k_accuracy(k), True)
    target, colon, attribute = spec.rpartition(":")
    if not colon:
        raise BuildError(f"metric {spec!r}: expected one of {METRIC_FORMS}")
    if not target.endswith(".py"):
        file = None
    elif file is None:
        file = Path(target)
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
