"""CPU profiles of the C target: the compiler, flags, kernel variant, weight layout and emulator board per core.

`cpu: host` (the default) compiles with the machine's own compiler for the
machine itself and keeps the x86-shaped kernels (int16 conv weights for
pmaddwd). A Cortex-M profile cross-compiles with arm-none-eabi-gcc for its
core and float ABI, stores every weight as int8 in flash, and picks the conv
kernel's inner loop by ISA: portable C99 (M0, M3), the DSP extension's dual
16-bit MACs (SMLAD, M4/M7/M33) or Helium/MVE vector MACs (M55). The artifact's
sources select that inner loop with the ACLE feature macros, so the same files
still build (portably) with any other compiler.

Float islands run on the profiles with an FPU (`Profile.fpu`: the host,
M4F, M7, M33, M55, built with -mfloat-abi=hard); M0 and M3 have none, so
they run integer layers only.

Each Cortex-M profile names the qemu board it is checked on and that board's
memory: code from `flash_origin`, data and stack from `ram_origin`.
"""

from __future__ import annotations

from dataclasses import dataclass

from dabuild.registry import Registry

HOST, PORTABLE, DSP, MVE = "host", "portable", "dsp", "mve"
ARM_PACKAGES = "gcc-arm-none-eabi libnewlib-arm-none-eabi"
QEMU_PACKAGE = "qemu-system-arm"


@dataclass(frozen=True)
class Board:
    """A qemu machine and the memory a bare-metal image may use on it."""

    machine: str
    flash_origin: int
    flash_bytes: int
    ram_origin: int
    ram_bytes: int


@dataclass(frozen=True)
class Profile:
    name: str
    compiler: str
    flags: tuple[str, ...]
    isa: str                       # host | portable | dsp | mve: the conv kernel's inner loop
    board: Board | None = None     # None: runs on the build machine itself
    for_size: bool = False         # the target's cflags optimise for size (-Os, -Oz): kernels pick the smaller code

    @property
    def cortex_m(self) -> bool:
        return self.board is not None

    @property
    def fpu(self) -> bool:
        """Whether the core computes float32 in hardware (the host does; M0 and M3 have no FPU): the profiles
        that run float islands."""
        return "-mfloat-abi=soft" not in self.flags

    @property
    def depth_multiple(self) -> int:
        """What the MCU conv pads its dot products' depth to: one MVE vector of int8, or a DSP word."""
        return 16 if self.isa == MVE else 4

    @property
    def interleaved(self) -> bool:
        """Conv weights stored (w0, w2, w1, w3) per 4: SXTB16 and SXTB16 ROR 8 then give the pairs SMLAD
        multiplies with the int16 columns, without repacking."""
        return self.isa == DSP


PROFILES: Registry[Profile] = Registry("CPU profile", "the c target")
FLOAT_ORDER = ("-ffp-contract=off",)   # every build of the artifact: see _profile


def _profile(name: str, isa: str, flags: tuple[str, ...], board: Board | None) -> None:
    """Every profile compiles with -ffp-contract=off: a float island's products and sums are rounded one by
    one, in the order the integer reference adds them (dabuild.qir.layers.island_order)."""
    compiler = "cc" if board is None else "arm-none-eabi-gcc"
    PROFILES.add(name, Profile(name, compiler, (*flags, *FLOAT_ORDER), isa, board))


_MPS2 = dict(flash_origin=0x00000000, flash_bytes=4 << 20, ram_origin=0x20000000, ram_bytes=4 << 20)
_profile("host", HOST, (), None)
_profile("cortex-m0", PORTABLE, ("-mcpu=cortex-m0", "-mthumb", "-mfloat-abi=soft"),
         Board("microbit", 0x00000000, 256 << 10, 0x20000000, 16 << 10))
_profile("cortex-m3", PORTABLE, ("-mcpu=cortex-m3", "-mthumb", "-mfloat-abi=soft"), Board("mps2-an385", **_MPS2))
_profile("cortex-m4", DSP, ("-mcpu=cortex-m4", "-mthumb", "-mfloat-abi=hard", "-mfpu=fpv4-sp-d16"),
         Board("mps2-an386", **_MPS2))
_profile("cortex-m7", DSP, ("-mcpu=cortex-m7", "-mthumb", "-mfloat-abi=hard", "-mfpu=fpv5-d16"),
         Board("mps2-an500", **_MPS2))
# AN505 boots secure: code in SSRAM1's secure alias, data in SSRAM2's.
_profile("cortex-m33", DSP, ("-mcpu=cortex-m33", "-mthumb", "-mfloat-abi=hard", "-mfpu=fpv5-sp-d16"),
         Board("mps2-an505", 0x10000000, 4 << 20, 0x38000000, 2 << 20))
# AN547: 512 KiB ITCM for code, 512 KiB DTCM for data.
_profile("cortex-m55", MVE, ("-mcpu=cortex-m55", "-mthumb", "-mfloat-abi=hard"),
         Board("mps3-an547", 0x00000000, 512 << 10, 0x20000000, 512 << 10))

CPUS = tuple(PROFILES)
