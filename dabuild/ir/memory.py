"""The memory budget of a run, and how many samples of a graph's activations fit in it.

`DABUILD_MEMORY` sets the budget in bytes (suffixes K, M, G: powers of 1024), by default half the machine's
physical memory. Stages that run the interpreter over batches (calibrate, tune) cap their batches at the
samples whose activations fit the budget after the graph's own weights; a model whose single sample does not
fit stops with a message naming the stage, what it needs and what the budget allows.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import math
from collections.abc import Callable, Iterator

import numpy as np

from dabuild.errors import BuildError
from dabuild.ir.graph import Graph
from dabuild.limits import BUDGET, memory_budget

# A sample's working set: its largest tensors alive together (a node's inputs and output), and the copies a
# step makes of them (a channels-last input, a channels-first copy for the histograms): about this many times
# the largest node's input + output bytes, as measured on ResNet-50 and MobileNetV2.
WORKING_SET_FACTOR = 3


def _tensor_bytes(graph: Graph) -> dict[str, int]:
    """Each activation's bytes for one sample (constants: 0)."""
    return {name: 0 if name in graph.constants else
            math.prod(d for d in spec.shape[1:] if d is not None) * np.dtype(spec.dtype).itemsize
            for name, spec in graph.tensor_shapes().items()}


def sample_bytes(graph: Graph) -> int:
    """Activation bytes one sample of `graph` needs at its busiest node (see WORKING_SET_FACTOR)."""
    size = _tensor_bytes(graph)
    busiest = max((sum(size[name] for name in (*node.inputs, *node.outputs)) for node in graph.nodes), default=0)
    return WORKING_SET_FACTOR * busiest


def kept_sample_bytes(graph: Graph) -> int:
    """Bytes of every node output of one sample at its float type: what a run keeping every intermediate holds
    at most (integer tensors take as many bytes or fewer)."""
    size = _tensor_bytes(graph)
    return sum(size[name] for node in graph.nodes for name in node.outputs)


def samples_that_fit(graph: Graph, stage: str, wanted: int, held: int = 0, holds: str = "",
                     budget: int | None = None) -> int:
    """The batch size to run `graph` with: `wanted`, or fewer if their activations would pass the budget
    after the weights and `held` bytes the stage keeps whatever the batch (`holds` says what they are).
    `budget` is this run's share of the memory budget (None: the whole, `memory_budget()`)."""
    whole = memory_budget()
    budget = whole if budget is None else budget
    weights = _weight_bytes(graph)
    per_sample = max(1, sample_bytes(graph))
    room = budget - 2 * weights - held  # the weights, the native conv's packed copy of them, what the stage keeps
    if room < per_sample:
        kept = f", {holds} {_gb(held)}" if held else ""
        share = f"its share ({_gb(budget)}) of " if budget < whole else ""
        raise BuildError(f"{stage}: the model needs about {_gb(2 * weights + held + per_sample)} (weights "
                         f"{_gb(2 * weights)}{kept}, one sample's activations {_gb(per_sample)}), more than "
                         f"{share}the memory budget of {_gb(whole)}; raise {BUDGET}, lower -j or use a machine "
                         f"with more memory")
    return max(1, min(wanted, room // per_sample))


def workers_that_fit(graph: Graph, wanted: int, budget: int, held: int = 0) -> int:
    """How many of `wanted` worker processes running `graph` fit `budget` together (at least 1): each may hold
    the weights twice, `held` bytes and one sample's activations (see `samples_that_fit`)."""
    need = 2 * _weight_bytes(graph) + held + max(1, sample_bytes(graph))
    return max(1, min(wanted, budget // need))


def _weight_bytes(graph: Graph) -> int:
    return sum(array.nbytes for array in graph.constants.values())


def release_free_memory() -> None:
    """Hand the memory freed so far back to the OS (glibc's malloc_trim; elsewhere nothing).

    Stages run one after another in one process. Arrays below glibc's mmap threshold (up to 32 MiB, such
    as calibration's per-tensor histograms) live on the heap, whose freed pages stay in the process until
    trimmed: without this, the next stage's peak would sit on top of the last one's.
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


# glibc's mallopt parameters, and the values its dynamic mmap threshold reaches on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX
# = 32 MiB, the trim threshold twice that).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
REUSED_BLOCK_BYTES = 32 << 20


def reuse_freed_arrays() -> None:
    """Let freed arrays up to 32 MiB be reused from the heap, as glibc's defaults do (elsewhere nothing).

    Dask's nanny starts workers with MALLOC_TRIM_THRESHOLD_ set, and setting any malloc threshold switches off
    glibc's dynamic mmap threshold: every activation array above 128 KiB is then mmapped, page-faulted in and
    unmapped again, per layer and per trial. On a ResNet-50 trial that cost 40 % of its time (bench/scale.py:
    1.69 trials/s in a plain process, 0.99 with that variable). Fixing the thresholds where the dynamic ones
    end restores the reuse; a stage still hands freed memory back with release_free_memory.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(M_MMAP_THRESHOLD, REUSED_BLOCK_BYTES)
    mallopt(M_TRIM_THRESHOLD, 2 * REUSED_BLOCK_BYTES)


M_MMAP_MAX, GLIBC_MMAP_MAX = -4, 65536  # mallopt's count of mmapped blocks, and glibc's default


@contextlib.contextmanager
def arrays_reused_in_heap() -> Iterator[None]:
    """Within: every array comes from the heap and a freed one stays there for the next (glibc; elsewhere
    nothing changes). After: reuse_freed_arrays' thresholds, and the freed heap handed back to the OS.

    glibc maps each array above its mmap threshold (32 MiB at most) on its own and unmaps it when it is freed,
    so a conv output of a 44-image ResNet-50 batch (up to 141 MB) is page-faulted in afresh, and zeroed by the
    kernel, every layer of every batch. Run over batches of one shape, the heap instead reaches the size of
    one batch's live tensors in the first batch and reuses it: perf on calibrate (64 images) counted
    clear_page_erms at 19 % of its samples with the mmaps, 11 % without, and 107,083 page faults against
    23,905. The setting is the process's: a stage running beside it on another thread (-j with several
    recipes) allocates from the heap too, which costs it memory held until the trim, never a wrong value.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        yield
        return
    mallopt(M_MMAP_MAX, 0)
    mallopt(M_TRIM_THRESHOLD, (1 << 31) - 1)  # mallopt takes an int: nothing below 2 GiB trimmed while within: the next batch takes the same memory
    try:
        yield
    finally:
        mallopt(M_MMAP_MAX, GLIBC_MMAP_MAX)
        reuse_freed_arrays()
        release_free_memory()


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


def _gb(size: int) -> str:
    return f"{size / 1e9:.2f} GB"

