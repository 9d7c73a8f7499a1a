"""Static activation memory: a liveness-based placement of buffers in one arena.

A buffer lives from the step that writes it to the last step that reads it
(a zero-copy alias is the same buffer, so its readers extend that life).
Each buffer goes at the lowest offset that overlaps no buffer alive at the
same time, placed in two orders, and the plan with the lower peak is kept:
largest first (greedy by size into the earliest gap that fits, as TFLite's
planner does) and in the order the steps write them. Neither is best
everywhere: on VWW's MobileNet, largest first puts the NCHW input's
conversion under the first pointwise conv's output and leaves a 9 KiB hole
(64,512 B against a 55,296 B bound), which the step order does not. An MLP
ends up with the classic ping-pong of two buffers either way. Kernels never
work in place: a step's inputs and outputs are alive together.

Three numbers judge a plan: its peak, the lower bound no placement can beat
(the largest sum of the sizes of buffers alive at one step), and the naive sum
of every buffer's size (what an allocator without reuse would take). Kernel
scratch is planned with the activations; the report also gives the lower bound
of the activations alone and the largest scratch, so each can be judged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Placement:
    tensor: str
    offset: int
    size: int
    first: int  # index of the step that writes it
    last: int   # index of the last step that reads it

    def overlaps_in_time(self, other: Placement) -> bool:
        return self.first <= other.last and other.first <= self.last

    def overlaps_in_space(self, offset: int, size: int) -> bool:
        return self.offset < offset + size and offset < self.offset + self.size


@dataclass(frozen=True)
class ArenaPlan:
    placements: dict[str, Placement]
    peak_bytes: int
    lower_bound_bytes: int   # the largest sum of sizes alive at one step
    naive_bytes: int         # every buffer in its own bytes
    activation_lower_bound_bytes: int = 0   # the same bound without kernel scratch
    scratch_bytes: int = 0                  # the largest kernel scratch

    def report(self) -> dict[str, int]:
        return {"peak_bytes": self.peak_bytes, "lower_bound_bytes": self.lower_bound_bytes,
                "naive_bytes": self.naive_bytes, "activation_lower_bound_bytes": self.activation_lower_bound_bytes,
                "scratch_bytes": self.scratch_bytes}


def alignment(size: int) -> int:
    """Offset alignment of a buffer: 16 bytes (a vector) for a kilobyte or more, 4 from 64 bytes, none below,
    where the padding would be a noticeable share of the buffer (the kernels read int8 at any address)."""
    return 16 if size >= 1024 else 4 if size >= 64 else 1


def _align(value: int, step: int) -> int:
    return -(-value // step) * step


def plan_arena(steps: Sequence[tuple[Sequence[str], Sequence[str]]], sizes: dict[str, int],
               external: set[str], wide: frozenset[str] = frozenset(), words: frozenset[str] = frozenset()) -> ArenaPlan:
    """Place every buffer written by `steps` (each (reads, writes)) except the `external` ones.

    `wide` buffers hold wider integers (int16 scratch): they are aligned to 16 bytes whatever their size.
    `words` buffers hold float32 values: aligned to 4 bytes at least.
    """
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for index, (reads, writes) in enumerate(steps):
        for name in writes:
            if name not in external and name not in first:
                first[name] = last[name] = index
        for name in reads:
            if name in first:
                last[name] = index
    orders = (sorted(first, key=lambda name: (-sizes[name], first[name], name)),
              sorted(first, key=lambda name: (first[name], -sizes[name], name)))
    candidates = [_place(order, sizes, first, last, wide, words) for order in orders]
    placed = min(candidates, key=_peak)   # the first on a tie: largest first
    peak = _peak(placed)
    alive = [sum(p.size for p in placed if p.first <= index <= p.last) for index in range(len(steps))]
    activations = [sum(p.size for p in placed if p.first <= index <= p.last and p.tensor not in wide)
                   for index in range(len(steps))]
    return ArenaPlan({p.tensor: p for p in sorted(placed, key=lambda p: (p.first, p.tensor))}, peak,
                     max(alive, default=0), sum(p.size for p in placed), max(activations, default=0),
                     max((p.size for p in placed if p.tensor in wide), default=0))


def _place(order: list[str], sizes: dict[str, int], first: dict[str, int], last: dict[str, int],
           wide: frozenset[str], words: frozenset[str]) -> list[Placement]:
    """Each buffer in `order` at the lowest aligned offset clear of the buffers placed before it that are alive
    at the same time."""
    placed: list[Placement] = []
    for name in order:
        candidate = Placement(name, 0, sizes[name], first[name], last[name])
        busy = sorted((p for p in placed if p.overlaps_in_time(candidate)), key=lambda p: p.offset)
        offset = 0
        for other in busy:
            if other.overlaps_in_space(offset, candidate.size):
                step = 16 if name in wide else max(alignment(candidate.size), 4 if name in words else 1)
                offset = _align(other.offset + other.size, step)
        placed.append(Placement(name, offset, candidate.size, candidate.first, candidate.last))
    return placed


def _peak(placed: list[Placement]) -> int:
    return max((p.offset + p.size for p in placed), default=0)
