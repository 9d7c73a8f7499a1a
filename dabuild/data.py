"""Calibration and evaluation data from .npz files, checked before any stage trusts it.

A recipe's data spec names an .npz, the array(s) feeding the graph inputs (`x`:
one key for a single-input graph, or a mapping input name -> key), optionally
the labels (`y`) and how many samples to use. Every problem a user can cause
(missing key, empty or non-finite array, x/y length mismatch) is reported with
the file and the key.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dabuild.errors import UsageError
from dabuild.limits import is_numeric, npz_headers


@dataclass(frozen=True)
class DataFile:
    """A data spec as a stage sees it: the keyed settings (x, y, samples, batch_size) and the declared file.

    The recipe's `DataSpec` has the same attributes; stages build this one from their
    `Stage.config` and `Stage.files`, so they read nothing their key does not hold.
    """

    source: Path
    x: str | dict[str, str] = "x"
    y: str | None = None
    samples: int | None = None
    batch_size: int = 64

    @classmethod
    def from_config(cls, config: dict[str, Any], source: Path) -> DataFile:
        return cls(Path(source), config["x"], config.get("y"), config.get("samples"), config["batch_size"])


def read_array(path: Path, key: str) -> np.ndarray:
    """Array `key` of the .npz `path`, its headers checked first (limits.py: sizes, archive ratio, a plain
    numeric dtype, so nothing is unpickled and nothing huge is allocated); UsageError naming file and key."""
    if not path.is_file():
        raise UsageError(f"data file {path} does not exist")
    headers = npz_headers(path)
    if key not in headers:
        raise UsageError(f"{path}: no array {key!r}; arrays in the file: {', '.join(headers) or 'none'}")
    if not is_numeric(headers[key][1]):
        raise UsageError(f"{path}: array {key!r} has dtype {headers[key][1]}; expected numbers (object arrays "
                         "are never read: they would be unpickled)")
    try:
        with np.load(path, allow_pickle=False) as archive:
            return archive[key]
    except (OSError, ValueError, EOFError) as error:
        raise UsageError(f"{path}: array {key!r} is not readable ({error})") from None


def _read(path: Path, key: str) -> np.ndarray:
    """One array of an .npz, checked to exist, be numeric, non-empty and finite."""
    array = read_array(path, key)
    if array.size == 0:
        raise UsageError(f"{path}: array {key!r} is empty (shape {array.shape})")
    if array.dtype.kind not in "biuf":
        raise UsageError(f"{path}: array {key!r} has dtype {array.dtype}; expected numbers")
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        bad = int(np.size(array) - np.isfinite(array).sum())
        raise UsageError(f"{path}: array {key!r} has {bad} NaN or infinite values")
    return array


def rows_in_file(spec: Any) -> int:
    """Rows the file holds for the (first) input array, from its header."""
    key = spec.x if isinstance(spec.x, str) else next(iter(dict(spec.x).values()))
    shape = npz_headers(Path(spec.source))[key][0]
    return shape[0] if shape else 0


def _input_keys(spec: Any, input_names: list[str]) -> dict[str, str]:
    """Graph input name -> npz key, from `spec.x`."""
    if isinstance(spec.x, str):
        if len(input_names) != 1:
            raise UsageError(
                f"data x {spec.x!r} names one array but the graph has inputs {', '.join(input_names)}; "
                "map each input to a key, e.g. x: {input_name: key}"
            )
        return {input_names[0]: spec.x}
    keys = dict(spec.x)
    if set(keys) != set(input_names):
        raise UsageError(
            f"data x maps inputs {', '.join(sorted(keys))} but the graph has inputs {', '.join(input_names)}"
        )
    return {name: keys[name] for name in input_names}


def _samples(array: np.ndarray, spec: Any) -> np.ndarray:
    return array if spec.samples is None else array[: spec.samples]


def load_inputs(spec: Any, input_names: list[str], integer: Collection[str] = (),
                stored: Mapping[str, tuple[float, int, str]] | None = None) -> dict[str, np.ndarray]:
    """Graph input name -> float32 array, int64 for the `integer` inputs (token ids), first `spec.samples` rows,
    all with one length. `spec.source` is taken as written (a loaded recipe's is absolute).

    `stored` (Graph.stored_inputs): inputs the model quantizes first thing, by (scale, zero point, storage
    type). An array of exactly that type holds the integers the model stores (an int8 .tflite input's), so it
    becomes the real values they stand for, (q - zero point) * scale, which the model's own quantization
    turns back into the same integers; an array of any other type holds real values. The dtype decides."""
    path = Path(spec.source)
    keys = _input_keys(spec, input_names)
    arrays = {name: _samples(_read(path, key), spec) for name, key in keys.items()}
    for name, array in arrays.items():
        if name in integer and array.dtype.kind not in "iu":
            raise UsageError(f"{path}: array {keys[name]!r} holds {array.dtype} values, but model input {name!r} "
                             "takes integers (indices into an embedding table); store it as integers")
        quantized = (stored or {}).get(name)
        if quantized is not None and array.dtype == np.dtype(quantized[2]):
            scale, zero_point, _ = quantized
            arrays[name] = ((array.astype(np.float64) - zero_point) * scale).astype(np.float32)
            continue
        arrays[name] = array.astype(np.int64 if name in integer else np.float32, copy=False)
    lengths = {keys[name]: len(array) for name, array in arrays.items()}
    if len(set(lengths.values())) > 1:
        listed = ", ".join(f"{key} has {n}" for key, n in lengths.items())
        raise UsageError(f"{path}: input arrays differ in their first dimension ({listed})")
    return arrays


def required_labels(spec: Any) -> np.ndarray:
    """The labels a metric scores against (the recipe refuses evaluation data without them)."""
    labels = load_labels(spec)
    if labels is None:
        raise UsageError(f"{spec.source}: evaluation data needs labels (`y: <key>`)")
    return labels


def load_labels(spec: Any) -> np.ndarray | None:
    """The labels `spec.y` (first `spec.samples` rows), or None; must match x in length."""
    if spec.y is None:
        return None
    path = Path(spec.source)
    labels = _samples(_read(path, spec.y), spec)
    x_key = spec.x if isinstance(spec.x, str) else next(iter(dict(spec.x).values()))
    x_length = len(_samples(_read(path, x_key), spec))
    if len(labels) != x_length:
        raise UsageError(
            f"{path}: labels {spec.y!r} have {len(labels)} rows but inputs {x_key!r} have {x_length} "
            "(first dimensions must match)"
        )
    return labels


def batches(arrays: dict[str, np.ndarray], batch_size: int) -> Iterator[dict[str, np.ndarray]]:
    """Consecutive slices of `batch_size` rows (the last may be shorter) across all arrays."""
    if batch_size <= 0:
        raise UsageError(f"batch size must be positive, got {batch_size}")
    length = len(next(iter(arrays.values())))
    for start in range(0, length, batch_size):
        yield {name: array[start : start + batch_size] for name, array in arrays.items()}
