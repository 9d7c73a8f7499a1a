"""How the C target stores a tensor, and the strided loop nests that move values between storages.

A QGraph tensor has a logical per-sample shape (the float graph's, channels
first). In C it is stored in a `Storage`: that shape plus the order of its
axes in memory, outermost first. Convolutions and pools want channels last
(NHWC), where one pixel's channels are contiguous and the inner loops of a
convolution are dot products over contiguous int8; everything else takes the
canonical order or any order, addressing it through strides.

A `Walk` is a nest of `for` loops over a box of values with one stride per
operand per loop, the loops of equal stride pattern merged: it is how the
layout ops (transpose, slice, pad, concat pieces, layout conversions),
broadcasting elementwise ops and reductions address any storage. Its bounds
and strides are literals, so the compiler sees contiguous inner loops.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Storage:
    shape: tuple[int, ...]   # logical per-sample shape
    order: tuple[int, ...]   # logical axes in memory order, outermost first

    @classmethod
    def canonical(cls, shape: tuple[int, ...]) -> Storage:
        return cls(tuple(shape), tuple(range(len(shape))))

    @classmethod
    def channels_last(cls, shape: tuple[int, ...]) -> Storage:
        """(C, *spatial) stored as (*spatial, C); rank < 2 has no channel axis to move."""
        if len(shape) < 2:
            return cls.canonical(shape)
        return cls(tuple(shape), (*range(1, len(shape)), 0))

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def strides(self) -> tuple[int, ...]:
        """Elements between neighbours along each logical axis."""
        strides = [0] * len(self.shape)
        step = 1
        for axis in reversed(self.order):
            strides[axis] = step
            step *= self.shape[axis]
        return tuple(strides)

    def permuted(self, perm: tuple[int, ...]) -> Storage:
        """The same bytes as the transpose by `perm` (output axis k is this storage's axis perm[k]) sees them:
        every value stays where it is, so the output's memory order is this one's, renamed."""
        return Storage(tuple(self.shape[axis] for axis in perm), tuple(perm.index(axis) for axis in self.order))

    def same_bytes(self, other: Storage) -> bool:
        """Both storages put every value at the same offset (axes of size 1 do not move anything)."""
        return (self.shape == other.shape
                and [a for a in self.order if self.shape[a] != 1] == [a for a in other.order if other.shape[a] != 1])

    @property
    def is_channels_last(self) -> bool:
        return self.same_bytes(Storage.channels_last(self.shape))

    @property
    def is_canonical(self) -> bool:
        return self.same_bytes(Storage.canonical(self.shape))


def broadcast_strides(operand: Storage, out_shape: tuple[int, ...]) -> tuple[int, ...]:
    """Strides of `operand` along each axis of `out_shape`, numpy-style right-aligned broadcasting (0 = repeat)."""
    lead = len(out_shape) - len(operand.shape)
    strides = [0] * len(out_shape)
    for axis, (size, stride) in enumerate(zip(operand.shape, operand.strides)):
        strides[lead + axis] = 0 if size == 1 else stride
    return tuple(strides)


@dataclass(frozen=True)
class Loop:
    size: int
    strides: tuple[int, ...]  # one per operand


@dataclass(frozen=True)
class Walk:
    """Nested loops over a box; operand k is addressed at `bases[k] + sum(index_j * loops[j].strides[k])`."""

    loops: tuple[Loop, ...]
    operands: tuple[str, ...]   # C names the offsets are called by, e.g. ("o", "i")
    bases: tuple[int, ...]

    @classmethod
    def over(cls, shape: tuple[int, ...], order: tuple[int, ...], operands: dict[str, tuple[int, ...]],
             bases: dict[str, int] | None = None) -> Walk:
        """Loops over logical `shape` in the memory order `order`; `operands` gives each one's logical strides."""
        names = tuple(operands)
        loops = [Loop(shape[axis], tuple(operands[name][axis] for name in names)) for axis in order]
        bases = bases or {}
        return cls(_merged(loops, len(names)), names, tuple(bases.get(name, 0) for name in names))

    @property
    def count(self) -> int:
        return int(np.prod([loop.size for loop in self.loops], dtype=np.int64))

    def open(self, indent: int = 1) -> str:
        """The `for` lines, one per loop; close them with `close()`."""
        pad = "    "
        return "\n".join(f"{pad * (indent + j)}for (int32_t i{j} = 0; i{j} < {loop.size}; ++i{j}) {{"
                         for j, loop in enumerate(self.loops))

    def close(self, indent: int = 1) -> str:
        pad = "    "
        return "\n".join(f"{pad * (indent + j)}}}" for j in reversed(range(len(self.loops))))

    def depth(self, indent: int = 1) -> str:
        """Indentation of the innermost body."""
        return "    " * (indent + len(self.loops))

    def offset(self, operand: str) -> str:
        """The C expression of the operand's offset at the current indices."""
        k = self.operands.index(operand)
        terms = [str(self.bases[k])] if self.bases[k] else []
        for j, loop in enumerate(self.loops):
            stride = loop.strides[k]
            if stride == 1:
                terms.append(f"i{j}")
            elif stride:
                terms.append(f"i{j} * {stride}")
        return " + ".join(terms) if terms else "0"


def _merged(loops: list[Loop], operands: int) -> tuple[Loop, ...]:
    """Drop loops of size 1 and merge an outer loop into the next when every stride continues across them."""
    kept = [loop for loop in loops if loop.size != 1]
    merged: list[Loop] = []
    for loop in kept:
        if merged:
            outer = merged[-1]
            if all(o == loop.size * i for o, i in zip(outer.strides, loop.strides)):
                merged[-1] = Loop(outer.size * loop.size, loop.strides)
                continue
        merged.append(loop)
    return tuple(merged) if merged else (Loop(1, (0,) * operands),)
