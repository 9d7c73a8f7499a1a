"""threads.c from Python: a native layer's output rows shared among this process's layer threads.

The float conv, depthwise conv and the integer reference's conv all compute output rows with a C function
`f(call, first row, end row)`; `RowSplitter` runs one over all rows of a layer, in chunks that threads.c's
persistent workers and the calling thread take from a shared counter (so a thread a busy machine delays
takes fewer), and it runs them on the calling thread alone when one thread is asked for.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import numpy as np

CHUNKS_PER_THREAD = 4  # a parallel layer's rows are handed out in about this many chunks per thread


@dataclass(frozen=True)
class RowsCall:
    """One call of a kernel `f(call, first row, end row)`, prepared: the kernel's name in the library, its call
    structure, the arrays the call points into, its rows (elements, for elementwise kernels), whether it has
    the work for threads to share them, and its result (a view of the output the call fills). Preparing apart
    from running lets tests/ir/arm64_kernels.py run the same call on arm64."""

    kernel: str
    call: ctypes.Structure
    arrays: tuple[np.ndarray, ...]
    rows: int
    result: np.ndarray
    parallel: bool = False


class RowSplitter:
    """threads.c's `parallel_rows` of one loaded library."""

    def __init__(self, library: ctypes.CDLL):
        self._parallel = library.parallel_rows
        self._parallel.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_ssize_t, ctypes.c_int]
        self._parallel.restype = None

    def __call__(self, function: Any, call: Any, rows: int, threads: int) -> None:
        """function(call, 0, rows) (a ctypes function of the library and a pointer to its call structure), its
        rows shared among up to `threads` threads; ctypes releases the GIL for the call."""
        parts = min(threads, rows)
        if parts <= 1:
            function(call, 0, rows)
            return
        chunk = max(1, rows // (parts * CHUNKS_PER_THREAD))
        self._parallel(ctypes.cast(function, ctypes.c_void_p), call, rows, chunk, parts)

    def run(self, function: Any, prepared: RowsCall, threads: int) -> np.ndarray:
        """A prepared call of `function` (its kernel), shared among `threads` if it has the work; its result."""
        self(function, ctypes.byref(prepared.call), prepared.rows, threads if prepared.parallel else 1)
        return prepared.result
