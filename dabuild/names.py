"""Fresh names for tensors, nodes and identifiers that emitters and converters invent."""

from __future__ import annotations


def unique_name(base: str, taken: set[str]) -> str:
    """`base`, else `base_1`, `base_2`, ...: the first not in `taken`, which it then joins."""
    name, index = base, 0
    while name in taken:
        index += 1
        name = f"{base}_{index}"
    taken.add(name)
    return name
