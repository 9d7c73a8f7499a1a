"""The interpreter's native conv: conv.c compiled by the system C compiler, loaded with ctypes.

numpy + BLAS run the interpreter's small convs far below this machine's peak,
and their im2col copy costs as much as the matmul. conv.c is a direct
convolution over channels-last tensors that the compiler vectorises over the
output channels. It is compiled once per (source, compiler version, flags, CPU)
into `<kernel cache>/<identity sha256>.<content sha256>.so` ($DABUILD_KERNEL_CACHE,
else kernels/ in dabuild's user cache folder; written to a temporary file and
renamed, so concurrent builds never load a half-written library) and loaded from
there ever after. A library proves itself before it is loaded: its bytes must hash
to the name's content hash (a truncated or damaged file would crash the process
in the loader); one that fails is deleted, warned about once and compiled again.
A kernel cache that cannot be written (full, read-only) costs a compile per
process, in a temporary folder removed at once, with one warning.

Flags: -O3 -march=native, so the vectors are as wide as this CPU's (one
AVX-512 register holds 16 output channels), and the compiler's default
floating-point contraction, so each multiply-add is one fused instruction where
the CPU has FMA. That makes results depend on the CPU, as OpenBLAS's already do;
the library's file name carries the CPU's identity, so a shared cache never hands
one CPU another's code. `native_backend()` says which conv ran; the calibrate
and tune stage keys include it.

DABUILD_NATIVE_KERNELS=0 forces the numpy path. Without a working compiler the
interpreter runs its convs in numpy and warns once, naming why (the stage keys
record the backend, so nothing cached under the other one is reused).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from importlib.resources import files
from pathlib import Path

import numpy as np

from dabuild.notices import warn

COMPILER = "cc"
FLAGS = ("-O3", "-march=native", "-shared", "-fPIC")
VECTOR = 16  # floats per vector in conv.c: the weight and bias are padded to whole vectors
SWITCH = "DABUILD_NATIVE_KERNELS"
KERNEL_CACHE = "DABUILD_KERNEL_CACHE"
TEMPORARY_PREFIX = ".build-"


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
        library, scratch = _build(compiler, version, source)
        try:
            return NativeConv(ctypes.CDLL(str(library)), version)
        finally:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)
    except (OSError, subprocess.SubprocessError) as error:
        warn(f"the interpreter's native conv kernels could not be built ({error}); its convs run in numpy, "
             f"more slowly (set {SWITCH}=0 to choose that and silence this warning)")
        return None


def _build(compiler: str, version: str, source: str) -> tuple[Path, Path | None]:
    """The compiled library for this source, compiler, flags and CPU: from the cache, else compiled into it.

    Returns the library and a temporary folder to remove once it is loaded (None for a cached library):
    from a kernel cache that cannot be written, the library is compiled in a temporary folder, which can
    go once loaded (the loader keeps the file mapped).
    """
    identity = hashlib.sha256("\n".join([source, version, " ".join(FLAGS), _cpu_identity()]).encode()).hexdigest()
    directory = kernel_dir()
    for library in sorted(directory.glob(f"{identity}.*.so")):
        if _proven(library):
            try:
                os.utime(library)  # its last use, for `dabuild cache prune`
            except OSError:
                pass
            return library, None
        warn(f"compiled kernel {library} is damaged (its bytes do not match the hash in its name); "
             "deleted and compiled again", key=str(library))
        try:
            library.unlink(missing_ok=True)
        except OSError:
            pass  # a read-only cache: compiled below for this run only
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=TEMPORARY_PREFIX, dir=directory) as building:
            built = _compile(compiler, source, Path(building))
            library = directory / f"{identity}.{_content_hash(built)}.so"
            os.replace(built, library)
        return library, None
    except OSError as error:  # full or read-only (a compiler error recurs below and is raised)
        reason = error.strerror or str(error)
    scratch = Path(tempfile.mkdtemp(prefix=TEMPORARY_PREFIX))
    try:
        built = _compile(compiler, source, scratch)
    except OSError:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    warn(f"the kernel cache {directory} cannot be written ({reason}); the native kernels are compiled "
         f"for this run only (set {KERNEL_CACHE} to a writable folder)")
    return built, scratch


def _compile(compiler: str, source: str, folder: Path) -> Path:
    source_file = folder / "conv.c"
    source_file.write_text(source)
    built = folder / "conv.so"
    result = subprocess.run([compiler, *FLAGS, "-o", str(built), str(source_file)],
                            capture_output=True, text=True, timeout=120)
    if result.returncode:
        raise OSError(f"{compiler} failed on conv.c: {result.stderr.strip()}")
    return built


def _content_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _proven(library: Path) -> bool:
    """Do the library's bytes hash to the content hash its name carries?"""
    try:
        return library.is_file() and _content_hash(library) == library.name.split(".")[1]
    except (OSError, IndexError):
        return False


def kernel_files() -> list[Path]:
    """Every compiled library in the kernel cache, for `dabuild cache info` and `prune`."""
    directory = kernel_dir()
    return sorted(directory.glob("*.so")) if directory.is_dir() else []


def kernel_temporaries() -> list[Path]:
    """Build folders that killed runs left in the kernel cache."""
    directory = kernel_dir()
    return sorted(directory.glob(f"{TEMPORARY_PREFIX}*")) if directory.is_dir() else []


def kernel_dir() -> Path:
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
