"""Byte-stable .npz files: the same arrays always give the same bytes.

`np.savez` stamps each member with the current time, so two saves of one graph
would differ and every content-addressed cache entry would look new. Writing
the zip ourselves with a fixed timestamp and sorted member names fixes that,
and `np.load` reads the result like any other .npz.

Members are stored uncompressed by default, so `read_npz(..., mapped=True)`
returns read-only arrays memory-mapped from the file: a stage touches only the
pages it reads, the OS drops them under pressure instead of swapping, and
processes reading one file (trial workers, concurrent builds) share one copy.
"""

from __future__ import annotations

import io
import math
import mmap
import os
import struct
import zipfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

_EPOCH = (1980, 1, 1, 0, 0, 0)  # the earliest date a zip header can hold
_HEADER_ROOM = 4096  # at least a .npy header's bytes


def write_npz(path: Path, arrays: Mapping[str, np.ndarray], compress: bool = False) -> None:
    """Write `arrays` to `path` as an .npz with members in sorted order and fixed timestamps."""
    method = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    with zipfile.ZipFile(path, "w", compression=method) as archive:
        for name in sorted(arrays):
            array = np.ascontiguousarray(arrays[name])
            member = zipfile.ZipInfo(f"{name}.npy", date_time=_EPOCH)
            member.compress_type = method
            member.external_attr = 0o644 << 16
            member.file_size = array.nbytes + _HEADER_ROOM  # decides ZIP64 headers; the true size is written after
            with archive.open(member, "w") as stream:  # streamed: no second copy of a large array in memory
                np.lib.format.write_array(stream, array, allow_pickle=False)


def read_npz(path: Path, mapped: bool = False) -> dict[str, np.ndarray]:
    """Every array of an .npz (no pickles: a data file must not run code): loaded eagerly, or with `mapped`
    read-only views of the file for its uncompressed members (the file must not change while they live:
    stage outputs never do)."""
    if not mapped:
        with np.load(path, allow_pickle=False) as archive:
            return {name: archive[name] for name in archive.files}
    arrays: dict[str, np.ndarray] = {}
    with open(path, "rb") as file, zipfile.ZipFile(file) as archive:
        size = os.fstat(file.fileno()).st_size
        whole = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        for member in archive.infolist():
            name = member.filename.removesuffix(".npy")
            if whole is None or member.compress_type != zipfile.ZIP_STORED:
                with archive.open(member) as stream:
                    arrays[name] = np.lib.format.read_array(stream, allow_pickle=False)
                continue
            arrays[name] = _mapped_member(whole, member)
    return arrays


def _mapped_member(whole: mmap.mmap, member: zipfile.ZipInfo) -> np.ndarray:
    """A stored member's array as a read-only view of the mapped file."""
    name_length, extra_length = struct.unpack("<HH", whole[member.header_offset + 26:member.header_offset + 30])
    start = member.header_offset + 30 + name_length + extra_length  # the local header's size
    header = io.BytesIO(whole[start:start + min(member.file_size, 1 << 16)])
    version = np.lib.format.read_magic(header)
    read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran, dtype = read_header(header)
    if dtype.hasobject:
        raise ValueError(f"{member.filename}: object arrays are not read (a data file must not run code)")
    if math.prod(shape) == 0:
        return np.empty(shape, dtype)
    return np.ndarray(shape, dtype, buffer=whole, offset=start + header.tell(), order="F" if fortran else "C")
