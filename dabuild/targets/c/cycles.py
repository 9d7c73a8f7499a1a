"""Estimated cycles of a Cortex-M inference: the instructions qemu executed, classed and priced by the core's timing.

qemu counts instructions, and an instruction count hides what the core pays
for loads, multiplies and taken branches. Debian ships no qemu-plugin.h, so
no TCG plugin of ours can class instructions inside qemu; instead the exec log
that firmware.count_instructions already reads gives the address of every
instruction executed (one per translation block under -singlestep), and the
image's own disassembly (arm-none-eabi-objdump) says what sits at each
address. Per address we keep three counts: executions, and arrivals from the
2-byte and the 4-byte instruction just before it (a straight-line step). From
those follow, exactly, how often each branch was taken and how often a load
or store followed another one; `estimate` prices the classes with the
core's published timing.

The timing tables are a model, stated in docs/design.md: Cortex-M4 from its
Technical Reference Manual's instruction timing (loads and stores 2 cycles, 1
when they follow another single load or store; LDM/STM/PUSH/POP 1 + N; a taken
branch 1 + P with P = 2, the middle of the manual's 1 to 3; MLA/MLS 2; SDIV/
UDIV priced at their worst, 12). Cortex-M55 has no public per-instruction
table of the same kind: its scalar instructions are priced as the M4's, and
the LE that closes a low-overhead loop as one
cycle (the core's loop cache branches back without a pipeline refill), each
Helium (MVE) instruction as two cycles, the M55 being dual-beat (two
32-bit beats per cycle on a 128-bit vector), one when it follows a vector
instruction of the other unit (memory against arithmetic), which the
architecture's beat-wise overlap lets run under it. Flash wait states, bus
contention and interrupt latency are not counted. Other cores: no estimate.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dabuild.errors import BuildError

OBJDUMP = "arm-none-eabi-objdump"
BRANCH_REFILL = 2   # P of the Cortex-M4 TRM: 1 to 3 cycles to refill the pipeline after a taken branch

ALU, LOAD_STORE, MULTIPLE, MULTIPLY, MULTIPLY_ACCUMULATE, DIVIDE, BRANCH = (
    "alu", "load/store", "load/store multiple", "multiply", "multiply-accumulate", "divide", "branch")
FLOAT, FLOAT_LONG, VECTOR_MEMORY, VECTOR = "float", "float divide/sqrt", "vector load/store", "vector"
LOOP_END = "loop end"

_LINE = re.compile(r"^\s*([0-9a-f]+):\t((?:[0-9a-f]{4} ?){1,2})\s*\t(\S+)\s*(.*)$")
_CONDITIONS = ("eq", "ne", "cs", "cc", "hs", "lo", "mi", "pl", "vs", "vc", "hi", "ls", "ge", "lt", "gt", "le", "al")
_MULTIPLY_ACCUMULATE = ("mla", "mls")
_DSP_MULTIPLY = ("smla", "smls", "smua", "smus", "smul", "smml", "smma", "umul", "umla", "umaal", "smmul")


@dataclass(frozen=True)
class Instruction:
    address: int
    size: int          # bytes: 2 or 4
    mnemonic: str      # without .n/.w
    operands: str


Disassembly = tuple[dict[int, Instruction], dict[str, int]]   # instructions by address, function addresses


def disassemble(image: Path) -> Disassembly:
    """Every instruction of the image's code by address, and its function symbols' addresses.

    Disassembled as Armv8.1-M mainline, a superset of every Cortex-M's Thumb: without it objdump reads an
    image's Helium instructions as the coprocessor instructions (LDC, CDP) whose encodings they reuse."""
    result = subprocess.run([OBJDUMP, "-d", "-m", "armv8.1-m.main", str(image)], check=False, capture_output=True, text=True)
    if result.returncode != 0:
        raise BuildError(f"{OBJDUMP} could not disassemble {image}: {result.stderr.strip()[:500]}")
    instructions: dict[int, Instruction] = {}
    symbols: dict[str, int] = {}
    for line in result.stdout.splitlines():
        if line.endswith(">:") and not line.startswith(" "):
            address, name = line[:-2].split(" <", 1)
            symbols[name] = int(address, 16)
            continue
        match = _LINE.match(line)
        if match is None or match.group(3).startswith("."):
            continue   # a literal pool word, or bytes objdump could not decode
        raw = match.group(2).split()
        mnemonic = match.group(3).removesuffix(".n").removesuffix(".w")
        instructions[int(match.group(1), 16)] = Instruction(int(match.group(1), 16), 2 * len(raw), mnemonic,
                                                            match.group(4))
    return instructions, symbols


def _registers(operands: str) -> list[str]:
    """The registers of an LDM/STM/PUSH/POP list, ranges expanded ({r4-r7, lr} -> r4 r5 r6 r7 lr)."""
    listed = operands[operands.find("{") + 1:operands.find("}")]
    names: list[str] = []
    for part in (p.strip() for p in listed.split(",") if p.strip()):
        if "-" in part:
            first, last = part.split("-")
            prefix = first.rstrip("0123456789")
            names += [f"{prefix}{n}" for n in range(int(first[len(prefix):]), int(last[len(prefix):]) + 1)]
        else:
            names.append(part)
    return names


def _is_branch(mnemonic: str) -> bool:
    if mnemonic in ("b", "bl", "blx", "bx", "cbz", "cbnz", "tbb", "tbh"):
        return True
    return mnemonic.startswith("b") and mnemonic[1:] in _CONDITIONS


def classify(instruction: Instruction) -> str:
    """The timing class of one instruction (the classes the tables price)."""
    m, operands = instruction.mnemonic, instruction.operands
    if _is_branch(m):
        return BRANCH
    if m.startswith("v"):
        if re.match(r"v(ldr|str|ld[24]|st[24]|ldm|stm|push|pop)", m):
            is_vector = "q" in operands.split(",")[0] or re.match(r"v(ld|st)[24]", m) is not None
            return VECTOR_MEMORY if is_vector else (MULTIPLE if re.match(r"v(ldm|stm|push|pop)", m) else LOAD_STORE)
        if re.search(r"\bq\d", operands):
            return VECTOR
        return FLOAT_LONG if m.startswith(("vdiv", "vsqrt")) else FLOAT
    if m in ("push", "pop") or m.startswith(("ldm", "stm")):
        return MULTIPLE
    if m.startswith(("ldr", "str", "lda", "stl")) or m in ("ldrex", "strex"):
        return LOAD_STORE
    if m.startswith(("sdiv", "udiv")):
        return DIVIDE
    if m.startswith(_MULTIPLY_ACCUMULATE):
        return MULTIPLY_ACCUMULATE
    if m.startswith(("mul", *_DSP_MULTIPLY)):
        return MULTIPLY
    if m in ("wls", "dls", "wlstp", "dlstp"):
        return ALU      # Armv8.1-M's loop start: sets up LR, one cycle
    if m in ("le", "letp"):
        return LOOP_END
    return ALU


@dataclass
class Execution:
    """What one inference executed, per halfword from `origin` (the image's first instruction): executions,
    and arrivals by a straight step from the 2-byte and from the 4-byte instruction before it."""

    origin: int
    executed: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    after_narrow: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    after_wide: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    @property
    def instructions(self) -> int:
        return int(self.executed.sum())

    def add(self, addresses: np.ndarray, previous: np.ndarray) -> None:
        """Count `addresses` (executed in order), each reached from `previous` (same length)."""
        if not len(addresses):
            return
        if int(addresses.min()) < self.origin:
            raise BuildError(f"qemu executed address {int(addresses.min()):#x}, below the image's code")
        step = addresses.astype(np.int64) - previous.astype(np.int64)
        slots = (addresses - np.uint32(self.origin)) >> 1
        size = max(int(slots.max()) + 1, len(self.executed))
        self.executed = _grow(self.executed, size) + np.bincount(slots, minlength=size)
        self.after_narrow = _grow(self.after_narrow, size) + np.bincount(slots[step == 2], minlength=size)
        self.after_wide = _grow(self.after_wide, size) + np.bincount(slots[step == 4], minlength=size)

    def at(self, counts: np.ndarray, address: int) -> int:
        slot = (address - self.origin) >> 1
        return int(counts[slot]) if 0 <= slot < len(counts) else 0

    def addresses(self) -> list[tuple[int, int]]:
        """(address, executions) of every instruction executed."""
        return [(self.origin + 2 * int(slot), int(self.executed[slot])) for slot in np.flatnonzero(self.executed)]


def _grow(counts: np.ndarray, size: int) -> np.ndarray:
    return counts if len(counts) >= size else np.concatenate([counts, np.zeros(size - len(counts), np.int64)])


@dataclass(frozen=True)
class Estimate:
    cycles: int
    classes: dict[str, int]     # class -> instructions executed
    taken_branches: int         # branches and loop ends that went elsewhere than the next instruction


@dataclass(frozen=True)
class Timing:
    """Cycles per class on one core: a single load/store (and one following another), a multiple per register,
    multiplies, divide, branch (not taken, and the refill a taken one adds), float, vector (alone and overlapped)."""

    core: str
    load_store: int = 2
    load_store_pipelined: int = 1
    multiply_accumulate: int = 2
    divide: int = 12
    branch_refill: int = BRANCH_REFILL
    float_long: int = 14
    loop_end: int = 1          # LE of a low-overhead loop (Armv8.1-M): the loop-end cache branches without a refill
    vector: int = 0            # 0: the core has no vector unit
    vector_overlapped: int = 0


TIMINGS = {"cortex-m4": Timing("cortex-m4"),
           "cortex-m55": Timing("cortex-m55", vector=2, vector_overlapped=1)}


def estimate(execution: Execution, instructions: dict[int, Instruction], timing: Timing) -> Estimate:
    """The estimated cycles of `execution` on `timing`'s core; BuildError if it executed an address the
    disassembly does not hold (the log and the image disagree)."""
    cycles, taken_total = 0, 0
    classes: dict[str, int] = {}
    for _, count, kind, taken, price in _priced(execution, instructions, timing):
        classes[kind] = classes.get(kind, 0) + count
        taken_total += taken
        cycles += price
    return Estimate(cycles, classes, taken_total)


@dataclass(frozen=True)
class Share:
    """What one function of the image took of an execution: instructions, and estimated cycles (None on a core
    without a timing model)."""

    instructions: int
    cycles: int | None


def by_function(execution: Execution, disassembly: Disassembly, timing: Timing | None) -> dict[str, Share]:
    """`execution` split by the function symbol each executed address lies in (the nearest at or below it),
    most cycles (or instructions) first: where an inference's time goes, layer by layer, since every layer's
    forward function is its own symbol (DABUILD_OUT_OF_LINE) and the helpers it inlines count as its own."""
    instructions, symbols = disassembly
    starts = sorted((address, name) for name, address in symbols.items())
    addresses = np.array([address for address, _ in starts], np.int64)
    prices = ({instruction.address: price for instruction, _, _, _, price in _priced(execution, instructions, timing)}
              if timing is not None else {})
    counts: dict[str, list[int]] = {}
    for address, count in execution.addresses():
        index = int(np.searchsorted(addresses, address, side="right")) - 1
        totals = counts.setdefault(starts[index][1] if index >= 0 else "?", [0, 0])
        totals[0] += count
        totals[1] += prices.get(address, 0)
    order = sorted(counts.items(), key=lambda item: (-item[1][1], -item[1][0], item[0]))
    return {name: Share(total[0], total[1] if timing is not None else None) for name, total in order}


def _priced(execution: Execution, instructions: dict[int, Instruction],
            timing: Timing) -> Iterator[tuple[Instruction, int, str, int, int]]:
    """Per instruction executed: it, its executions, its class, how often it branched away, and its cycles."""
    memory = {LOAD_STORE}
    for address, count in execution.addresses():
        instruction = instructions.get(address)
        if instruction is None:
            raise BuildError(f"qemu executed address {address:#x}, which the image's disassembly does not hold")
        kind = classify(instruction)
        straight_on = execution.at(execution.after_narrow if instruction.size == 2 else execution.after_wide,
                                   address + instruction.size)
        taken, cycles = 0, 0
        if kind in (BRANCH, LOOP_END):
            taken = count - straight_on
            if kind == LOOP_END:
                cycles = count * timing.loop_end
            else:
                cycles = count + taken * timing.branch_refill + (count if instruction.mnemonic in ("tbb", "tbh") else 0)
        elif kind == LOAD_STORE:
            double = instruction.mnemonic.startswith(("ldrd", "strd"))
            after = _arrivals_from(execution, instructions, address, memory) if not double else 0
            cycles = count * (3 if double else timing.load_store) - after * (timing.load_store
                                                                              - timing.load_store_pipelined)
        elif kind == MULTIPLE:
            registers = _registers(instruction.operands)
            refill = timing.branch_refill if "pc" in registers else 0
            cycles = count * (1 + len(registers) + refill)
        elif kind in (VECTOR, VECTOR_MEMORY):
            other = {VECTOR_MEMORY} if kind == VECTOR else {VECTOR}
            overlapped = _arrivals_from(execution, instructions, address, other)
            cycles = count * timing.vector - overlapped * (timing.vector - timing.vector_overlapped)
        else:
            cycles = count * {MULTIPLY_ACCUMULATE: timing.multiply_accumulate, DIVIDE: timing.divide,
                              FLOAT_LONG: timing.float_long}.get(kind, 1)
        yield instruction, count, kind, taken, cycles


def _arrivals_from(execution: Execution, instructions: dict[int, Instruction], address: int,
                   kinds: set[str]) -> int:
    """How often the instruction at `address` ran straight after an instruction of one of `kinds`."""
    total = 0
    for size, counts in ((2, execution.after_narrow), (4, execution.after_wide)):
        before = instructions.get(address - size)
        if before is not None and before.size == size and classify(before) in kinds:
            total += execution.at(counts, address)
    return total
