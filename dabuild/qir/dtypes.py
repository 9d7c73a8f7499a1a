"""The integer types of dabuild's integer path: `int2`..`int16` and `uint1`..`uint16`, by name.

One name says everything the lowering, the reference kernels and the
targets need: signedness, width, the value range, and the numpy type the
values are stored in. Storage is the narrowest numpy integer of the same
signedness that holds the range (int2..int8 -> int8, int9..int16 -> int16,
uint1..uint8 -> uint8, uint9..uint16 -> uint16): the names ONNX QDQ zero
points take for int8/uint8/int16/uint16, and a narrower type is simply a
clamped range inside its storage, so the int8 kernels (numpy and C) run
int2..int8 unchanged. Which widths a backend runs is its capability's
business (capabilities/*.yaml); this module only knows what a name means.

Accumulators: dense/conv sums of operands of at most 8 bits stay inside
int32 (what the C kernels and every int8 runtime accumulate in); wider
operands accumulate in int64, bounded by 2**53 so the reference's float64
matrix products stay exact.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

from dabuild.errors import BuildError

MAX_BITS = 16
EXACT_MAX_BITS = 32  # int17..int32 (uint17..uint32): only the exact tensors of fixed-point given models hold them
MIN_BITS = {True: 2, False: 1}  # int1 would hold only {-1, 0}: no symmetric range; uint1 is {0, 1}
_NAME = re.compile(r"(u?)int(\d+)")
NAMES_TEXT = f"int{MIN_BITS[True]}..int{MAX_BITS} and uint{MIN_BITS[False]}..uint{MAX_BITS}"  # for messages
NARROW_ACCUMULATOR_MAX = 2**31 - 1  # operands of <= 8 bits: int32 accumulators
WIDE_ACCUMULATOR_MAX = 2**53 - 1    # wider operands: int64, kept where float64 sums are exact


@dataclass(frozen=True)
class IntType:
    """A fixed-width integer type: `signed` two's complement or unsigned, `bits` wide."""

    name: str
    signed: bool
    bits: int

    @property
    def qmin(self) -> int:
        return -(2 ** (self.bits - 1)) if self.signed else 0

    @property
    def qmax(self) -> int:
        return 2 ** (self.bits - 1) - 1 if self.signed else 2**self.bits - 1

    @property
    def storage(self) -> str:
        """The numpy dtype name the values are stored in."""
        return f"{'' if self.signed else 'u'}int{8 if self.bits <= 8 else 16 if self.bits <= 16 else 32}"

    @property
    def levels(self) -> int:
        """How many integers the type holds (the length of a lookup table over it)."""
        return self.qmax - self.qmin + 1


@cache
def type_names() -> tuple[str, ...]:
    """Every integer type name dabuild knows: int2..int16, then uint1..uint16."""
    return (*(f"int{b}" for b in range(MIN_BITS[True], MAX_BITS + 1)),
            *(f"uint{b}" for b in range(MIN_BITS[False], MAX_BITS + 1)))


def is_int_type(name: str) -> bool:
    """Whether `name` is an integer type dabuild lowers (int2..int16, uint1..uint16)."""
    return name in type_names()


@cache
def int_type(name: str) -> IntType:
    """The integer type called `name`; BuildError naming the known ones for anything else.

    Besides the types tuning chooses from (`type_names`), int17..int32 and uint17..uint32 name the exact
    tensors a fixed-point given model leaves unquantized (an accumulator HGQ2 keeps at its full width)."""
    match = _NAME.fullmatch(name)
    if match is not None:
        signed, bits = not match.group(1), int(match.group(2))
        if MIN_BITS[signed] <= bits <= EXACT_MAX_BITS and str(bits) == match.group(2):
            return IntType(name, signed, bits)
    raise BuildError(f"unknown integer dtype {name!r} (dabuild lowers {NAMES_TEXT})")


def fitting_type(low: int, high: int, where: str) -> str:
    """The narrowest type holding every integer of [low, high] (unsigned when low >= 0); BuildError past 32 bits."""
    bits = max(int(high).bit_length(), int(-low - 1).bit_length() if low < 0 else 0) + (low < 0)
    name = f"{'' if low < 0 else 'u'}int{max(bits, MIN_BITS[low < 0])}"
    if max(bits, 1) > EXACT_MAX_BITS:
        raise BuildError(f"{where}: its exact values [{low}, {high}] need {bits} bits, more than the "
                         f"{EXACT_MAX_BITS} dabuild holds; quantize the tensor (an output quantizer)")
    return name


def accumulator_max(*operands: str) -> int:
    """The largest |sum| a dense/conv/pool accumulator over values of these dtypes may reach (module doc)."""
    narrow = all(int_type(name).bits <= 8 for name in operands)
    return NARROW_ACCUMULATOR_MAX if narrow else WIDE_ACCUMULATOR_MAX
