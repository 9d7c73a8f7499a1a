"""The one parser of sizes a user writes: `budget: {flash: 64KiB}`, `cache prune --max-size 500M`,
`DABUILD_MEMORY=2G`.

Binary, decided once: every unit is a power of 1024, whichever spelling names it (`1M`, `1MB` and `1MiB`
are all 1,048,576 bytes; `k`, `kB`, `KiB` are 1024), because every size dabuild reads measures memory,
flash or disk, which are sized in powers of two. A plain number is bytes; a decimal fraction is allowed
(`1.5GiB`); case and a space before the unit do not matter.
"""

from __future__ import annotations

import re

_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(?:([kmgt])(?:i?b)?|b)?\s*", re.IGNORECASE)
_POWERS = "kmgt"
EXAMPLES = "65536, 64K, 64KB, 64KiB, 2MiB, 1.5G"


def parse_size(value: int | str) -> int:
    """Bytes of a size as a user writes it (see the module doc); ValueError naming the value otherwise."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    match = _SIZE.fullmatch(str(value))
    if match is None or isinstance(value, bool):
        raise ValueError(f"{value!r} is not a size (e.g. {EXAMPLES}; units are powers of 1024)")
    number, unit = match.groups()
    return int(float(number) * 1024 ** (_POWERS.index(unit.lower()) + 1 if unit else 0))
