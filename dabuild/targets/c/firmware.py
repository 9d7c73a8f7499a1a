"""Cortex-M images of a C artifact: cross-compiled, linked for a qemu board, run and measured under qemu.

The image is the artifact's own test driver (main.c) on bare metal: the
artifact's firmware/startup.c (vector table, reset handler) and
firmware/link.ld (the board's flash and RAM) around it, newlib with
semihosting (librdimon) for the files. main.c reads inputs.bin and writes
outputs.bin in the folder qemu runs in, all samples in one boot, so a check
of many samples costs one emulator start.

Measured for the firmware engineer: the model object's flash (text, rodata,
data from the cross toolchain's `size`), RAM (bss, which holds the arena, and
the stack model_forward needs, from -fstack-usage) and the instructions one
inference retires. The count comes from qemu itself: one instruction per
translation block (-singlestep) and a log line per block executed
(-d exec,nochain), counted between two calls of dabuild_mark that a counting
build (-DDABUILD_COUNT) places around model_forward. qemu 7.2's -icount
only paces a virtual clock, and Debian ships no TCG plugins.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np

from dabuild.errors import BuildError
from dabuild.targets.c import cycles
from dabuild.targets.c.cycles import Execution
from dabuild.targets.c.profiles import ARM_PACKAGES, QEMU_PACKAGE, Profile

FIRMWARE = "firmware"
STARTUP, LINKER_SCRIPT = f"{FIRMWARE}/startup.c", f"{FIRMWARE}/link.ld"
STACK_RESERVE = 4096   # bytes of RAM the linker keeps free for newlib's heap (file buffers) and the stack
QEMU = "qemu-system-arm"
MARK = "dabuild_mark"
LINK_FLAGS = ("--specs=rdimon.specs", "-nostartfiles", "-Wl,--gc-sections")
SECTION_FLAGS = ("-ffunction-sections", "-fdata-sections")


class BoardOverflow(BuildError):
    """The model's image does not fit its board's flash or RAM (tuning takes it as a config that does not fit)."""


def require(program: str, packages: str) -> str:
    path = shutil.which(program)
    if path is None:
        raise BuildError(f"{program} was not found on PATH; the c target's Cortex-M profiles need it: install the "
                         f"Debian packages {packages} (apt-get install {packages})")
    return path


@dataclass(frozen=True)
class Image:
    elf: Path
    model_object: Path
    stack_usage: Path   # model.su from -fstack-usage
    map_file: Path      # the linker's map


def compile_lines(profile: Profile, cflags: list[str], artifact: str, out: str,
                  defines: tuple[str, ...] = ()) -> list[list[str]]:
    """The commands that build `out`/image.elf from the artifact folder `artifact` (paths as given)."""
    compiler = profile.compiler
    flags = [*profile.flags, *defines, f"-Wa,-I{artifact}"]   # model.c's .incbin of weights.bin, if it has one
    model = [compiler, "-std=c99", *flags, *cflags, *SECTION_FLAGS, "-fstack-usage", "-c",
             f"{artifact}/model.c", "-o", f"{out}/model.o"]
    link = [compiler, "-std=c99", *flags, *cflags, *SECTION_FLAGS, *LINK_FLAGS, f"-Wl,-Map={out}/image.map",
            "-T", f"{artifact}/{LINKER_SCRIPT}",
            "-o", f"{out}/image.elf", f"{artifact}/main.c", f"{artifact}/{STARTUP}", f"{out}/model.o"]
    return [model, link]


def build_image(profile: Profile, cflags: list[str], artifact_dir: Path, work_dir: Path,
                defines: tuple[str, ...] = ()) -> Image:
    """Compile and link the artifact's image into `work_dir`; BuildError with the compiler's words on failure,
    naming the board's memory when the image does not fit it."""
    require(profile.compiler, ARM_PACKAGES)
    work_dir.mkdir(parents=True, exist_ok=True)
    for line in compile_lines(profile, cflags, str(artifact_dir), str(work_dir), defines):
        result = subprocess.run(line, check=False, capture_output=True, text=True, cwd=work_dir)
        if result.returncode == 0:
            continue
        message = result.stderr.strip()
        if "rdimon.specs" in message:
            raise BuildError(f"newlib for arm-none-eabi is missing ({message.splitlines()[0]}); install the Debian "
                             f"packages {ARM_PACKAGES}")
        overflow = re.findall(r"region `(\w+)' overflowed by (\d+) bytes|RAM overflowed[^\n]*", message)
        if overflow and profile.board is not None:
            board = profile.board
            raise BoardOverflow(f"the {profile.name} image of {artifact_dir} does not fit board {board.machine} "
                             f"(flash {board.flash_bytes} bytes, RAM {board.ram_bytes} bytes): {message}")
        raise BuildError(f"building the {profile.name} image of {artifact_dir} with {profile.compiler} failed:\n"
                         f"{message}")
    return Image(work_dir / "image.elf", work_dir / "model.o", work_dir / "model.su", work_dir / "image.map")


def require_room(profile: Profile, artifact_dir: Path, ram: dict[str, int], flash: dict[str, int]) -> None:
    """BuildError, before anything runs, when the parts of RAM or flash a model needs add up to more than its
    board has: each total with its parts and the board's size, in bytes."""
    board = profile.board
    assert board is not None  # a Cortex-M profile names its board
    over = []
    for memory, parts, size in (("RAM", ram, board.ram_bytes), ("flash", flash, board.flash_bytes)):
        total = sum(parts.values())
        if total > size:
            detail = " + ".join(f"{name} {value}" for name, value in parts.items() if value)
            over.append(f"{memory} needs {total} bytes ({detail}) but the board has {size}, {total - size} too few")
    if over:
        raise BoardOverflow(f"the {profile.name} build of {artifact_dir} does not fit board {board.machine}: "
                         + "; ".join(over) + "; make the model smaller or choose a cpu whose board has more memory")


def qemu_line(profile: Profile, image: str) -> list[str]:
    assert profile.board is not None
    return [QEMU, "-M", profile.board.machine, "-nographic", "-monitor", "none", "-serial", "none",
            "-semihosting-config", "enable=on,target=native", "-kernel", image]


def run_image(profile: Profile, image: Path, work_dir: Path, timeout: float) -> None:
    """Boot `image` in qemu in `work_dir` (where main.c finds inputs.bin); BuildError on a failure or timeout."""
    require(QEMU, QEMU_PACKAGE)
    try:
        result = subprocess.run(qemu_line(profile, str(image)), check=False, capture_output=True, text=True, cwd=work_dir,
                                timeout=timeout)
    except subprocess.TimeoutExpired:
        raise BuildError(f"the {profile.name} image {image} did not finish in qemu within {timeout:g} s "
                         "(options.timeout of the c target)") from None
    if result.returncode != 0:
        why = "a fault (exit 99)" if result.returncode == 99 else f"exit {result.returncode}"
        assert profile.board is not None  # qemu_line needed it
        raise BuildError(f"the {profile.name} image {image} failed in qemu {profile.board.machine} with {why}: "
                         f"{(result.stderr + result.stdout).strip()[-2000:]}")


_HEX = np.full(256, 255, np.uint8)
_HEX[np.frombuffer(b"0123456789abcdef", np.uint8)] = np.arange(16, dtype=np.uint8)
_PC_OFFSET = 10        # "[cs_base/pc/...": the pc's 8 hex digits start 10 bytes after the bracket
_NIBBLE_SHIFTS = np.arange(28, -1, -4, dtype=np.uint32)


def _addresses(lines: bytes) -> np.ndarray:
    """The guest pc of every trace line of a qemu exec log (each line one executed instruction)."""
    raw = np.frombuffer(lines, np.uint8)
    digits = _HEX[raw[np.flatnonzero(raw == ord("["))[:, None] + _PC_OFFSET + np.arange(8)]]
    if (digits == 255).any():
        raise BuildError("qemu's exec log has a line whose pc is not 8 hex digits: this qemu's log format is "
                         "not the one dabuild reads (qemu 7.2)")
    return (digits.astype(np.uint32) << _NIBBLE_SHIFTS).sum(axis=1, dtype=np.uint32)


def _executions_between_marks(log: IO[bytes], mark: int, origin: int) -> list[Execution]:
    """What ran between consecutive pairs of executions of the instruction at `mark` (dabuild_mark), counted
    from `origin`, the image's first instruction."""
    done: list[Execution] = []
    current: Execution | None = None
    previous, carry = np.zeros(1, np.uint32), b""
    while chunk := log.read(1 << 24):
        chunk = carry + chunk
        cut = chunk.rfind(b"\n") + 1
        addresses = _addresses(chunk[:cut])
        carry = chunk[cut:]
        before = np.concatenate([previous, addresses[:-1]])
        starts = [0, *(np.flatnonzero(addresses == mark) + 1)]
        for begin, end in zip(starts, [*starts[1:], len(addresses) + 1]):
            if current is not None:
                current.add(addresses[begin:end - 1], before[begin:end - 1])
            if end <= len(addresses):          # a mark ends this piece: a window opens or closes
                if current is None:
                    current = Execution(origin)
                else:
                    done.append(current)
                    current = None
        if len(addresses):
            previous = addresses[-1:]
    return done


def trace_executions(profile: Profile, image: Path, work_dir: Path, timeout: float,
                     disassembly: cycles.Disassembly) -> list[Execution]:
    """What each model_forward call of a counting image executed (per address), one entry per sample;
    `disassembly` is the image's (cycles.disassemble), which the caller may also price the executions with."""
    require(QEMU, QEMU_PACKAGE)
    instructions, symbols = disassembly
    if MARK not in symbols:
        raise BuildError(f"{image} has no {MARK} function: it is not a counting build (-DDABUILD_COUNT)")
    line = [*qemu_line(profile, str(image)), "-singlestep", "-d", "exec,nochain", "-D", "/dev/stdout"]
    with subprocess.Popen(line, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=work_dir) as process:
        assert process.stdout is not None
        try:
            executions = _executions_between_marks(process.stdout, symbols[MARK], min(instructions))
            process.wait(timeout=timeout)
        finally:
            process.kill()
    if process.returncode != 0 or not executions:
        raise BuildError(f"counting the instructions of {image} in qemu failed (exit {process.returncode})")
    return executions


def count_instructions(profile: Profile, image: Path, work_dir: Path, timeout: float) -> list[int]:
    """Instructions each model_forward call of a counting image retired, one entry per sample."""
    executions = trace_executions(profile, image, work_dir, timeout, cycles.disassemble(image))
    return [execution.instructions for execution in executions]


_INPUT_SECTION = re.compile(r"^ (\.\S+)\s+0x[0-9a-f]+\s+0x([0-9a-f]+)\s+(\S+)$", re.MULTILINE)


def linked_sizes(map_file: Path, counted: Callable[[str, str], bool]) -> dict[str, int]:
    """Bytes of text, rodata, data and bss the linker kept (its map after --gc-sections) of the input sections
    `counted(section, source)` names, `source` being an object or an archive member (`lib.a(member.o)`)."""
    text = map_file.read_text()
    kept = text[text.index("Linker script and memory map"):]
    kept = re.sub(r"^( \.\S+)\n\s+0x", r"\1 0x", kept, flags=re.MULTILINE)  # a long name: the rest on the next line
    totals = {"text": 0, "rodata": 0, "data": 0, "bss": 0}
    for section, size, source in _INPUT_SECTION.findall(kept):
        kind = _kind(section)
        if kind and int(size, 16) and counted(section, source):
            totals[kind] += int(size, 16)
    return totals


def _kind(section: str) -> str | None:
    for kind in ("text", "rodata", "data", "bss"):
        if section == f".{kind}" or section.startswith(f".{kind}."):
            return kind
    return None


def stack_bytes(stack_usage: Path) -> int:
    """model_forward's frame plus the deepest frame of any other function of the model (the layers it calls)."""
    frames = {}
    for line in stack_usage.read_text().splitlines():
        fields = line.split("\t")
        if len(fields) >= 2 and fields[1].isdigit():
            frames[fields[0].rsplit(":", 1)[-1]] = int(fields[1])
    own = frames.pop("model_forward", 0)
    frames.pop("model_forward_float", None)
    return own + max(frames.values(), default=0)


def measure(image: Image) -> dict[str, int]:
    """Flash and RAM of the model object (what a firmware links), and the stack of model_forward."""
    # the model object alone: what the model costs in a firmware, without the float interface a program that
    # never calls it drops
    totals = linked_sizes(image.map_file, lambda _, source: Path(source).name == image.model_object.name)
    return {"text_bytes": totals["text"], "rodata_bytes": totals["rodata"], "data_bytes": totals["data"],
            "bss_bytes": totals["bss"], "flash_bytes": totals["text"] + totals["rodata"] + totals["data"],
            "stack_bytes": stack_bytes(image.stack_usage),
            "ram_bytes": totals["data"] + totals["bss"] + stack_bytes(image.stack_usage)}
