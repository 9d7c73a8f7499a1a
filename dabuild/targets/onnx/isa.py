"""Which instruction set an onnx artifact will run on, and whether onnxruntime's u8s8 kernels can saturate there.

onnxruntime (MLAS) multiplies a uint8 activation by an int8 weight on x86-64 with `pmaddubsw` where the CPU
has no VNNI: it sums the products of two neighbouring inputs into a *saturating int16* before widening, so
a pair whose products add up beyond [-32768, 32767] is clipped (255 * 127 * 2 = 64,770). int8 activations
do not escape it: onnxruntime on x86-64 shifts them to uint8 (zero point + 128) before the same kernel.
VNNI's `vpdpbusd` (AVX512-VNNI, AVX-VNNI) adds the four products into int32 directly, and arm64's dot
products and widening multiplies are exact, so only x86-64 without VNNI saturates.

Two forms run exactly there, measured on an AMD EPYC with AVX2 and no VNNI (onnxruntime 1.32): weights
within [-64, 64] (7 bits: 255 * 64 * 2 = 32,640 fits int16), which keep the u8s8 kernels, and uint8
weights (the int8 ones plus 128, zero point 128), which onnxruntime runs with its u8u8 kernels that widen
both sides to int16 before multiplying, 1.1x to 1.5x the time of u8s8 there (bench/ort_isa.py).
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Literal

Isa = Literal["auto", "avx512-vnni", "avx-vnni", "avx512", "avx2", "x86-64", "arm64"]
ISAS: tuple[str, ...] = ("avx512-vnni", "avx-vnni", "avx512", "avx2", "x86-64", "arm64")
# x86-64 without VNNI: pmaddubsw (AVX2, AVX512BW), and SSE4.1's pmaddubsw where onnxruntime dispatches it.
SATURATING = frozenset({"avx512", "avx2", "x86-64"})
SAFE_WEIGHT = 64  # |w| <= 64: a pair of products by uint8 activations stays within int16 (255 * 64 * 2 = 32,640)
CPUINFO = Path("/proc/cpuinfo")


def detect(cpuinfo: str | None = None, machine: str | None = None) -> str:
    """This machine's instruction set as the onnx target names it, from /proc/cpuinfo's flags (`cpuinfo`: that
    file's text; `machine`: platform.machine())."""
    machine = (machine or platform.machine()).lower()
    if machine in ("aarch64", "arm64"):
        return "arm64"
    if cpuinfo is None:
        try:
            cpuinfo = CPUINFO.read_text(errors="replace")
        except OSError:
            cpuinfo = ""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            flags = set(value.split())
            break
    if "avx512_vnni" in flags:
        return "avx512-vnni"
    if "avx_vnni" in flags:
        return "avx-vnni"
    if "avx512bw" in flags:
        return "avx512"
    if "avx2" in flags:
        return "avx2"
    return "x86-64"


def resolve(isa: str) -> str:
    """The instruction set an option names: `auto` is this machine's."""
    return detect() if isa == "auto" else isa


def saturates(isa: str) -> bool:
    """Whether onnxruntime's u8s8 kernels can saturate on `isa` (resolved: not `auto`)."""
    return isa in SATURATING
