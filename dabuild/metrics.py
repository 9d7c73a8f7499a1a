"""The metrics dabuild knows by name, in one place: their names (which recipe validation checks, importing
no numpy), how each scores outputs against labels, and which way is better.

Built in: `accuracy` (argmax against integer labels), `mse`, and top-k accuracy as `top_k` (k = 5) or
`top_<k>` such as `top_3`. Any other metric is the user's function (`dabuild.tune.metric.load_metric`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from dabuild.errors import BuildError, UsageError

if TYPE_CHECKING:
    import numpy as np

LOWER_IS_BETTER = frozenset({"mse"})
DEFAULT_TOP_K = 5
_TOP_K = re.compile(r"^top_(k|[1-9][0-9]*)$")
METRIC_FORMS = ("'accuracy', 'mse', 'top_k' (k = 5), 'top_<k>' such as 'top_3', "
                "'file.py:function' or 'package.module:function'")


def top_k_of(metric: str) -> int | None:
    """k of a `top_k` / `top_<k>` metric name, None for any other name."""
    match = _TOP_K.match(metric)
    if match is None:
        return None
    return DEFAULT_TOP_K if match.group(1) == "k" else int(match.group(1))


def accuracy(outputs: np.ndarray, labels: np.ndarray) -> float:
    """Share of rows whose largest output (over the last axis) is at the integer label."""
    import numpy as np

    if outputs.shape[:-1] != labels.shape:
        raise UsageError(
            f"accuracy needs labels of shape {outputs.shape[:-1]} for outputs {outputs.shape}, got {labels.shape}"
        )
    return float(np.mean(outputs.argmax(axis=-1) == labels))


def mse(outputs: np.ndarray, labels: np.ndarray) -> float:
    """Mean squared error between outputs and targets of the same shape."""
    import numpy as np

    if outputs.shape != labels.shape:
        raise UsageError(f"mse needs targets of the outputs' shape {outputs.shape}, got {labels.shape}")
    return float(np.mean((outputs.astype(np.float64) - labels) ** 2))


BUILT_IN: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {"accuracy": accuracy, "mse": mse}
BUILTIN_METRICS = tuple(BUILT_IN)  # the fixed names; top_k / top_<k> besides




def top_k_accuracy(k: int) -> Callable[[np.ndarray, np.ndarray], float]:
    """Share of rows whose integer label is among the k largest outputs (over the last axis).

    Ties rank as a stable descending sort would (the lower class index first),
    the order `argmax` breaks ties in, so `top_1` equals `accuracy` even on
    quantized outputs, where ties are common.
    """
    import numpy as np

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


def evaluate_metric(metric: str, outputs: np.ndarray, labels: np.ndarray) -> float:
    """The named metric of model outputs against labels."""
    if metric not in BUILT_IN:
        raise UsageError(f"unknown metric {metric!r}; available: {', '.join(sorted(BUILT_IN))}")
    import numpy as np

    return BUILT_IN[metric](np.asarray(outputs), np.asarray(labels))
