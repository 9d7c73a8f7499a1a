"""Limits on what a model or data file may make dabuild allocate, checked from headers before loading.

A file is small; what it declares need not be: a .npy header may claim a shape
of 2^40 rows or a 3.5 GB header, a zip member may inflate a thousandfold, an
ONNX graph may hold 10^5 nodes or a ConstantOfShape of 10^9 floats. Each is
checked here from what the file states, before numpy, keras or onnx allocate,
and refused as one UsageError naming the file, the part and the number.

The limits are environment settings, so a user with a bigger machine (or a
bigger model) raises them without touching a recipe (they do not change what a
build computes, only whether it starts):

- DABUILD_MEMORY: the run's memory budget (ir/memory.py cuts batches to it);
  no one declared array or archive member may pass it (default: half the
  machine's memory);
- DABUILD_MAX_NODES: nodes an ONNX graph (operators a .tflite file) may hold (default 50,000; real
  models dabuild targets hold hundreds, a large transformer a few thousand);
- DABUILD_MAX_CONSTANT_ELEMENTS: elements a constant computed while loading
  a graph (ConstantOfShape, Expand, Tile, Range) may hold (default 2^28, a
  GiB of float32; shape arithmetic makes a few dozen);
- DABUILD_MAX_ZIP_RATIO: how many times its stored size a member over 16 MiB
  may inflate to (default 200: arrays of real data deflate 1-10x, a
  bomb ~1000x).

numpy is not imported here: validation reads headers without it.
"""

from __future__ import annotations

import ast
import math
import os
import re
import zipfile
from pathlib import Path
from typing import IO, Any

from dabuild.errors import UsageError
from dabuild.sizes import parse_size

MAX_NPY_HEADER_BYTES = 65_536  # numpy writes headers under 4 KiB and its own reader stops at 10,000
_RATIO_FLOOR = 16 * 1024**2  # members smaller than this inflate as they like: they cannot hurt
BUDGET = "DABUILD_MEMORY"
_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)
_DESCR = re.compile(r"^[<>|=]?([biufcOUSVmM?])(\d*)$")
NUMERIC_KINDS = "biuf?"
_ITEM_BYTES = {"O": 8, "?": 1, "b": 1}  # kinds whose descr carries no size; U counts 4 bytes a character


def _setting(name: str, default: int) -> int:
    text = os.environ.get(name)
    if not text:
        return default
    match = _SIZE.match(text)
    if not match:
        raise UsageError(f"{name}={text!r}: expected a whole number, optionally with K, M, G or T")
    return int(match.group(1)) * 1024 ** " kmgt".index((match.group(2) or " ").lower())


def memory_budget() -> int:
    """Bytes this run may use: `DABUILD_MEMORY` (a size as sizes.py reads it: `2G`, `1.5GiB`, bytes) or half
    the physical memory. The interpreter cuts batches to it (ir/memory.py); one declared array, constant or
    archive member may not pass it."""
    text = os.environ.get(BUDGET, "").strip()
    if not text:
        return _physical_memory() // 2
    try:
        value = parse_size(text)
    except ValueError as error:
        raise UsageError(f"{BUDGET}: {error}") from None
    if value <= 0:
        raise UsageError(f"{BUDGET}={text!r} must be positive")
    return value


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def max_nodes() -> int:
    return _setting("DABUILD_MAX_NODES", 50_000)


def check_constant_size(where: str, node: Any, elements: int | None) -> None:
    """UsageError if the load-time constant the ONNX `node` would compute holds more elements than allowed."""
    limit = _setting("DABUILD_MAX_CONSTANT_ELEMENTS", 2**28)
    if elements is not None and elements > limit:
        raise UsageError(f"{where}: node {node.label!r} ({node.op_type}) would make a constant of {elements:,} "
                         f"elements, over the limit of {limit:,} (DABUILD_MAX_CONSTANT_ELEMENTS); refused before "
                         "computing it")


def max_zip_ratio() -> int:
    return _setting("DABUILD_MAX_ZIP_RATIO", 200)


def human(size: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:,} {unit}" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024  # type: ignore[assignment]  # a float from here on, for the one decimal shown
    raise AssertionError("unreachable")


def check_declared_bytes(where: Path | str, what: str, size: int) -> None:
    """UsageError if `what` in `where` declares more bytes than the memory budget."""
    budget = memory_budget()
    if size > budget:
        raise UsageError(f"{where}: {what} declares {size:,} bytes ({human(size)}), over the memory budget of "
                         f"{budget:,} bytes (DABUILD_MEMORY); refused before loading")


def check_zip_members(archive: zipfile.ZipFile, where: Path | str) -> None:
    """Every member of `archive` within the memory budget and the compression ratio bound (Python's zipfile
    never inflates a member past the size it declares, so the declared size bounds what reading it costs)."""
    ratio_bound = max_zip_ratio()
    for member in archive.infolist():
        check_declared_bytes(where, f"archive member {member.filename}", member.file_size)
        if member.file_size > _RATIO_FLOOR and member.file_size > ratio_bound * max(member.compress_size, 1):
            ratio = member.file_size / max(member.compress_size, 1)
            raise UsageError(f"{where}: archive member {member.filename} inflates {ratio:,.0f}-fold "
                             f"({member.compress_size:,} to {member.file_size:,} bytes), beyond the bound of "
                             f"{ratio_bound} (DABUILD_MAX_ZIP_RATIO); a zip bomb is refused before inflating")


def npy_header(stream: IO[bytes], where: str) -> tuple[tuple[int, ...], str]:
    """(shape, dtype descr) from a .npy header, checked: a sane header length, a tuple of non-negative
    integers for the shape, a plain dtype, and the declared bytes within the memory budget. ValueError
    (message for the user, naming `where`) otherwise. Whether the dtype is numeric is the caller's to
    check for the arrays it uses (an object array would be unpickled: `is_numeric`)."""
    magic = stream.read(8)
    if len(magic) < 8 or magic[:6] != b"\x93NUMPY":
        raise ValueError(f"{where} is not a .npy array (no NUMPY magic)")
    length_bytes = 2 if magic[6] == 1 else 4
    length = int.from_bytes(stream.read(length_bytes), "little")
    if length > MAX_NPY_HEADER_BYTES:
        raise ValueError(f"{where}: the .npy header claims {length:,} bytes; headers hold at most "
                         f"{MAX_NPY_HEADER_BYTES:,}")
    try:
        header = ast.literal_eval(stream.read(length).decode("latin1"))
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        raise ValueError(f"{where}: the .npy header is not a Python dict literal") from None
    if not isinstance(header, dict) or not {"shape", "descr"} <= set(header):
        raise ValueError(f"{where}: the .npy header lacks 'shape' or 'descr'")
    shape, descr = header["shape"], header["descr"]
    if not isinstance(shape, tuple) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                 for d in shape):
        raise ValueError(f"{where}: the .npy header's shape {str(shape)[:60]} is not a tuple of sizes")
    item_bytes = _item_bytes(descr)
    if item_bytes is None:
        raise ValueError(f"{where}: dtype {str(descr)[:60]} is not an array type dabuild can size")
    check_declared_bytes(where, f"shape {shape} of {str(descr)[:60]}", math.prod(shape) * item_bytes)
    return shape, descr if isinstance(descr, str) else repr(descr)


def _item_bytes(descr: object) -> int | None:
    """Bytes of one element of a .npy dtype descr: a plain type ('<f4'), or a structured one (a list of
    (name, descr[, shape]) fields, which numpy writes for record arrays); None for anything else."""
    if isinstance(descr, str):
        kind = _DESCR.match(descr)
        if kind is None:
            return None
        return _ITEM_BYTES.get(kind.group(1)) or int(kind.group(2) or 1) * (4 if kind.group(1) == "U" else 1)
    if not isinstance(descr, list):
        return None
    total = 0
    for field in descr:
        if not isinstance(field, tuple) or len(field) not in (2, 3):
            return None
        inner = _item_bytes(field[1])
        shape = field[2] if len(field) == 3 else ()
        if inner is None or not isinstance(shape, tuple) or not all(isinstance(d, int) and d >= 0 for d in shape):
            return None
        total += inner * math.prod(shape)
    return total


def is_numeric(descr: str) -> bool:
    return descr.lstrip("<>|=")[:1] in NUMERIC_KINDS


def npz_headers(source: Path, shown: str | None = None) -> dict[str, tuple[tuple[int, ...], str]]:
    """Array name -> (shape, dtype descr) of an .npz, from its member list and headers alone, every limit
    checked. UsageError naming the file (as `shown`, else the path) and the array on any problem."""
    where = shown or str(source)
    try:
        with zipfile.ZipFile(source) as archive:
            check_zip_members(archive, where)
            headers = {}
            for member in archive.namelist():
                if member.endswith(".npy"):
                    with archive.open(member) as stream:
                        headers[member[: -len(".npy")]] = npy_header(stream, f"{where}: array {member[:-4]!r}")
            return headers
    except (OSError, zipfile.BadZipFile, EOFError, KeyError) as error:
        raise UsageError(f"cannot read {where} as an .npz archive: {error}") from None
    except ValueError as error:
        raise UsageError(str(error)) from None
