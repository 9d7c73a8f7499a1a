"""NNEF tensor files (.dat): a 128-byte little-endian header, then the raw items in C order.

Header layout (NNEF 1.0, "Tensor file format"):

    offset size  field
         0    2  magic 0x4E 0xEF
         2    2  version major, minor (1, 0)
         4    4  data length in bytes
         8    4  rank (at most 8)
        12   32  extent of each axis (uint32 x 8, unused ones 0)
        44    4  bits per item
        48    2  item type code (below)
        50    2  item type vendor (0 = Khronos)
        52   76  reserved, zero

Item type codes: 0 IEEE float, 1 unsigned integer, 2 quantized unsigned
integer, 3 quantized signed integer, 4 signed integer. A quantized code says
the values are the integers of a quantized tensor whose scale and zero point
are in graph.quant; dabuild stores int8 weights of tract's quantized kernels
that way, and every other integer tensor (int32 biases) as a plain integer.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

MAGIC = b"\x4e\xef"
VERSION = (1, 0)
HEADER_BYTES = 128
MAX_RANK = 8
_HEADER = struct.Struct("<2sBBII8IIHH")  # the fields up to the vendor; zero padding follows

FLOAT, UNSIGNED, QUANTIZED_UNSIGNED, QUANTIZED_SIGNED, SIGNED = 0, 1, 2, 3, 4
_DTYPES = {  # (code, bits) -> numpy dtype
    (FLOAT, 16): np.float16, (FLOAT, 32): np.float32, (FLOAT, 64): np.float64,
    **{(code, 8 * np.dtype(t).itemsize): t for code in (UNSIGNED, QUANTIZED_UNSIGNED)
       for t in (np.uint8, np.uint16, np.uint32, np.uint64)},
    **{(code, 8 * np.dtype(t).itemsize): t for code in (SIGNED, QUANTIZED_SIGNED)
       for t in (np.int8, np.int16, np.int32, np.int64)},
}


def item_code(dtype: np.dtype, quantized: bool) -> int:
    """The item type code of `dtype`; `quantized` integers get the quantized codes."""
    kind = np.dtype(dtype).kind
    if kind == "f":
        return FLOAT
    if kind in "ui":
        signed = kind == "i"
        if quantized:
            return QUANTIZED_SIGNED if signed else QUANTIZED_UNSIGNED
        return SIGNED if signed else UNSIGNED
    raise ValueError(f"NNEF tensor files hold floats and integers, not {np.dtype(dtype)}")


def encode(array: np.ndarray, quantized: bool = False) -> bytes:
    """The bytes of the .dat file holding `array` (little endian)."""
    array = np.asarray(array)
    if array.ndim > MAX_RANK:
        raise ValueError(f"NNEF tensors have rank at most {MAX_RANK}, got shape {array.shape}")
    data = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
    dims = [*array.shape, *[0] * (MAX_RANK - array.ndim)]
    header = _HEADER.pack(MAGIC, *VERSION, len(data), array.ndim, *dims, 8 * array.dtype.itemsize,
                          item_code(array.dtype, quantized), 0)
    return header.ljust(HEADER_BYTES, b"\0") + data


def decode(blob: bytes) -> tuple[np.ndarray, bool]:
    """The array of a .dat file's bytes and whether its item type is a quantized one."""
    if len(blob) < HEADER_BYTES:
        raise ValueError(f"an NNEF tensor file has a {HEADER_BYTES}-byte header; got {len(blob)} bytes")
    magic, major, minor, length, rank, *rest = _HEADER.unpack_from(blob)
    dims, (bits, code, vendor) = rest[:MAX_RANK], rest[MAX_RANK:]
    if magic != MAGIC or (major, minor) != VERSION:
        raise ValueError(f"not an NNEF 1.0 tensor file (magic {magic.hex()}, version {major}.{minor})")
    if rank > MAX_RANK or vendor != 0 or (code, bits) not in _DTYPES:
        raise ValueError(f"unsupported NNEF tensor: rank {rank}, item type {code} of {bits} bits, vendor {vendor}")
    dtype = np.dtype(_DTYPES[code, bits]).newbyteorder("<")
    shape = tuple(dims[:rank])
    if length != dtype.itemsize * int(np.prod(shape, dtype=np.int64)) or len(blob) != HEADER_BYTES + length:
        raise ValueError(f"NNEF tensor of shape {shape} and {bits}-bit items does not hold {length} data bytes")
    array = np.frombuffer(blob, dtype, offset=HEADER_BYTES).reshape(shape)
    return array.astype(dtype.newbyteorder("=")), code in (QUANTIZED_SIGNED, QUANTIZED_UNSIGNED)


def write_tensor(path: Path, array: np.ndarray, quantized: bool = False) -> None:
    Path(path).write_bytes(encode(array, quantized))


def read_tensor(path: Path) -> tuple[np.ndarray, bool]:
    return decode(Path(path).read_bytes())
