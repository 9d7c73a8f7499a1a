"""Static activation memory: a liveness-based placement of tensors in one arena.

A tensor lives from the layer that writes it to the last layer that reads it.
Tensors are placed largest first at the lowest offset that overlaps no tensor
alive at the same time (greedy first fit, as TFLite Micro's planner does), so
an MLP ends up with the classic ping-pong of two buffers. Kernels never work
in place: a layer's input and output are alive together.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Placement:
    tensor: str
    offset: int
    size: int
    first: int  # index of the layer that writes it
    last: int   # index of the last layer that reads it

    def overlaps_in_time(self, other: "Placement") -> bool:
        return self.first <= other.last and other.first <= self.last

    def overlaps_in_space(self, offset: int, size: int) -> bool:
        return self.offset < offset + size and offset < self.offset + self.size


@dataclass(frozen=True)
class ArenaPlan:
    placements: dict[str, Placement]
    peak_bytes: int


def _align(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment


def plan_arena(steps: Sequence[tuple[Sequence[str], Sequence[str]]], sizes: dict[str, int],
               external: set[str], alignment: int = 4) -> ArenaPlan:
    """Place every tensor written by `steps` (each (inputs, outputs)) except the `external` ones.

    Offsets are multiples of `alignment`, so wider integer tensors can share the arena later.
    """
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for index, (inputs, outputs) in enumerate(steps):
        for name in outputs:
            if name not in external:
                first[name] = last[name] = index
        for name in inputs:
            if name in first:
                last[name] = index
    order = sorted(first, key=lambda name: (-sizes[name], first[name], name))
    placed: list[Placement] = []
    for name in order:
        candidate = Placement(name, 0, sizes[name], first[name], last[name])
        busy = sorted((p for p in placed if p.overlaps_in_time(candidate)), key=lambda p: p.offset)
        offset = 0
        for other in busy:
            if other.overlaps_in_space(offset, candidate.size):
                offset = _align(other.offset + other.size, alignment)
        placed.append(Placement(name, offset, candidate.size, candidate.first, candidate.last))
    peak = max((p.offset + p.size for p in placed), default=0)
    return ArenaPlan({p.tensor: p for p in sorted(placed, key=lambda p: (p.first, p.tensor))}, peak)
