"""The interpreter's native conv: conv.c compiled by the system C compiler, loaded with ctypes.

numpy + BLAS run the interpreter's small convs far below this machine's peak,
and their im2col copy costs as much as the matmul. conv.c is a direct
convolution over channels-last tensors that the compiler vectorises over the
output channels. It is compiled once per (source, compiler version, flags, CPU)
into `<kernel cache>/<sha256>.so` ($DABUILD_KERNEL_CACHE, else kernels/ in
dabuild's user cache folder; written to a temporary file and renamed, so
concurrent builds never load a half-written library) and loaded from there
ever after.

Flags: -O3 -march=native, so the vectors are as wide as this CPU's (one
AVX-512 register holds 16 output channels), and the compiler's default
floating-point contraction, so each multiply-add is one fused instruction where
the CPU has FMA. That makes results depend on the CPU, as OpenBLAS's already do;
the library's file name carries the CPU's identity, so a shared cache never hands
one CPU another's code. `native_backend()` says which conv ran; the calibrate
and tune stage keys include it.

DABUILD_NATIVE_KERNELS=0 forces the numpy path. Without a working compiler the
interpreter falls back to numpy, noting why once at debug level.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from importlib.resources import files
from pathlib import Path

import numpy as np

LOG = logging.getLogger(__name__)
COMPILER = "cc"
FLAGS = ("-O3", "-march=native", "-shared", "-fPIC")
VECTOR = 16  # floats per vector in conv.c: the weight and bias are padded to whole vectors
SWITCH = "DABUILD_NATIVE_KERNELS"
KERNEL_CACHE = "DABUILD_KERNEL_CACHE"


class ConvCall(ctypes.Structure):
    """conv.c's `Conv`: one conv's tensors and geometry."""

    _fields_ = [
        ("x", ctypes.c_void_p), ("height", ctypes.c_ssize_t), ("width", ctypes.c_ssize_t),
        ("channels", ctypes.c_ssize_t),
        ("weight", ctypes.c_void_p), ("kernel_h", ctypes.c_ssize_t), ("kernel_w", ctypes.c_ssize_t),
        ("out_channels", ctypes.c_ssize_t), ("padded_channels", ctypes.c_ssize_t),
        ("bias", ctypes.c_void_p), ("residual", ctypes.c_void_p), ("y", ctypes.c_void_p),
        ("out_h", ctypes.c_ssize_t), ("out_w", ctypes.c_ssize_t),
        ("stride_h", ctypes.c_ssize_t), ("stride_w", ctypes.c_ssize_t),
        ("pad_top", ctypes.c_ssize_t), ("pad_left", ctypes.c_ssize_t),
        ("dilation_h", ctypes.c_ssize_t), ("dilation_w", ctypes.c_ssize_t),
        ("relu", ctypes.c_int), ("zeros", ctypes.c_void_p),
    ]


class NativeConv:
    """conv.c's `conv2d_nhwc` and `depthwise2d_nhwc`, with numpy arrays in and out."""

    def __init__(self, library: ctypes.CDLL, compiler: str):
        self.compiler = compiler
        self._dense, self._depthwise = library.conv2d_nhwc, library.depthwise2d_nhwc
        for kernel in self._dense, self._depthwise:
            kernel.argtypes = [ctypes.POINTER(ConvCall), ctypes.c_ssize_t]
            kernel.restype = None

    def __call__(self, x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, residual: np.ndarray | None,
                 strides: list[int], pads: list[int], dilations: list[int], out: list[int], relu: bool,
                 depthwise: bool = False) -> np.ndarray:
        """y = relu?(conv(x) + bias + residual) as an (N, OH, OW, O) float32 array; `depthwise`: groups == C == O.

        x is (N, H, W, C), weight (O, C, KH, KW) as in the graph, residual (N, OH, OW, O) or None, all float32,
        x and residual C-contiguous; pads are the (top, left) ones, `out` is (OH, OW).
        """
        batch, height, width, channels = x.shape
        out_channels, _, kernel_h, kernel_w = weight.shape
        padded = -(-out_channels // VECTOR) * VECTOR
        taps = np.zeros((kernel_h, kernel_w, *(() if depthwise else (channels,)), padded), np.float32)
        taps[..., :out_channels] = weight[:, 0].transpose(1, 2, 0) if depthwise else weight.transpose(2, 3, 1, 0)
        if bias is not None:
            bias = np.concatenate([bias, np.zeros(padded - out_channels, np.float32)])
        zeros = np.zeros(channels, np.float32)
        y = np.empty((batch, *out, out_channels), np.float32)
        call = ConvCall(
            x.ctypes.data, height, width, channels,
            taps.ctypes.data, kernel_h, kernel_w, out_channels, padded,
            None if bias is None else bias.ctypes.data, None if residual is None else residual.ctypes.data,
            y.ctypes.data, out[0], out[1], strides[0], strides[1], pads[0], pads[1], dilations[0], dilations[1],
            int(relu), zeros.ctypes.data,
        )
        function = self._depthwise if depthwise else self._dense
        function(ctypes.byref(call), batch)  # ctypes releases the GIL for the call
        return y


def native_conv() -> NativeConv | None:
    """The native conv, or None when DABUILD_NATIVE_KERNELS=0 or no C compiler can build it."""
    if os.environ.get(SWITCH, "1") == "0":
        return None
    return _load()


def native_backend() -> str:
    """Which conv the interpreter runs here, for stage keys and benchmarks: 'native kernels: <compiler>' or 'numpy'."""
    conv = native_conv()
    return f"native kernels: {conv.compiler}" if conv else "numpy"


def compiler_path() -> Path | None:
    """The C compiler's executable file (symbolic links followed, so an upgrade changes it), or None."""
    found = shutil.which(COMPILER)
    return Path(found).resolve() if found else None


@functools.cache
def _load() -> NativeConv | None:
    compiler = shutil.which(COMPILER)
    try:
        if compiler is None:
            raise OSError(f"no C compiler {COMPILER!r} on PATH")
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=True,
                                 timeout=60).stdout.strip().partition("\n")[0]
        source = files("dabuild.ir.kernels").joinpath("conv.c").read_text()
        library = _build(compiler, version, source)
        return NativeConv(ctypes.CDLL(str(library)), version)
    except (OSError, subprocess.SubprocessError) as error:
        LOG.debug("native kernels unavailable, the interpreter's convs run in numpy: %s", error)
        return None


def _build(compiler: str, version: str, source: str) -> Path:
    """The compiled library for this source, compiler, flags and CPU: from the cache, else compiled into it."""
    identity = "\n".join([source, version, " ".join(FLAGS), _cpu_identity()])
    directory = _kernel_dir()
    library = directory / f"{hashlib.sha256(identity.encode()).hexdigest()}.so"
    if library.exists():
        return library
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory) as scratch:
        source_file = Path(scratch) / "conv.c"
        source_file.write_text(source)
        built = Path(scratch) / library.name
        result = subprocess.run([compiler, *FLAGS, "-o", str(built), str(source_file)],
                                capture_output=True, text=True, timeout=120)
        if result.returncode:
            raise OSError(f"{compiler} failed on conv.c: {result.stderr.strip()}")
        os.replace(built, library)
    return library


def _kernel_dir() -> Path:
    """`$DABUILD_KERNEL_CACHE`, else `kernels/` in the platform's user cache folder of dabuild.

    Apart from the run cache (`$DABUILD_CACHE`): a compiled kernel is a tool, not a result, so a private
    run cache (a test's, a CI job's) still finds the library compiled before.
    """
    configured = os.environ.get(KERNEL_CACHE)
    if configured:
        return Path(configured).expanduser()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("dabuild")) / "kernels"


def _cpu_identity() -> str:
    """What -march=native compiles for: the CPU's model and feature flags (Linux), else the platform's name."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return f"{platform.machine()} {platform.processor()}"
    wanted = ("model name", "flags", "Features", "CPU part")
    return "\n".join(sorted({line for line in lines if line.split(":")[0].strip() in wanted}))
