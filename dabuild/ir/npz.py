"""Byte-stable .npz files: the same arrays always give the same bytes.

`np.savez` stamps each member with the current time, so two saves of one graph
would differ and every content-addressed cache entry would look new. Writing
the zip ourselves with a fixed timestamp and sorted member names fixes that,
and `np.load` reads the result like any other .npz.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

_EPOCH = (1980, 1, 1, 0, 0, 0)  # the earliest date a zip header can hold


def write_npz(path: Path, arrays: Mapping[str, np.ndarray], compress: bool = False) -> None:
    """Write `arrays` to `path` as an .npz with members in sorted order and fixed timestamps."""
    method = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    with zipfile.ZipFile(path, "w", compression=method) as archive:
        for name in sorted(arrays):
            buffer = io.BytesIO()
            np.lib.format.write_array(buffer, np.ascontiguousarray(arrays[name]), allow_pickle=False)
            member = zipfile.ZipInfo(f"{name}.npy", date_time=_EPOCH)
            member.compress_type = method
            member.external_attr = 0o644 << 16
            archive.writestr(member, buffer.getvalue())


def read_npz(path: Path) -> dict[str, np.ndarray]:
    """Every array of an .npz, loaded eagerly (no pickles: a data file must not run code)."""
    with np.load(path, allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}
