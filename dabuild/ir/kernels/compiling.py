"""Compiling the interpreter's native kernels into the kernel cache, once per machine.

The library is compiled once per (sources, compiler version, flags, vector path, CPU) into
`<kernel cache>/<path>-<identity sha256>.<content sha256>.so` ($DABUILD_KERNEL_CACHE, else kernels/ in dabuild's
user cache folder), written to a temporary file and renamed, so concurrent builds never load a half-written
library, and loaded from there ever after. A library proves itself before it is loaded: its bytes must hash
to the name's content hash (a truncated or damaged file would crash the process in the loader); one that
fails is deleted, warned about once and compiled again. A kernel cache that cannot be written (full,
read-only) costs a compile per process, in a temporary folder removed at once, with one warning. A shared
kernel cache (not the user's own folder, or group- or world-writable; dabuild/trust.py) loads only libraries
signed with the team key ($DABUILD_CACHE_KEY, `<library>.sig`): a hash in a name proves the file whole, not
who put it there. Without a key nothing is loaded from a shared kernel cache; with one, what it compiles it signs.

Each source file is its own translation unit, compiled in parallel on the cores this process may use, then
linked. There is no time limit: a busy machine's compile is slow, not wrong, so it waits and says so
(`compiling native kernels ...` on stderr, again every PROGRESS_SECONDS). The compiler's own temporary
files go to the build folder (TMPDIR), so a compile that fails or is interrupted leaves nothing in /tmp.
A compiler error is reported by its first error line.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dabuild.notices import warn
from dabuild.trust import KEY_ENV, TeamKey, key_from, shared_folder

KERNEL_CACHE = "DABUILD_KERNEL_CACHE"
TEMPORARY_PREFIX = ".build-"
PROGRESS_SECONDS = 30.0


@dataclass(frozen=True)
class Sources:
    """A library's source: its translation units and the headers they include (file name -> text), the
    compiler flags, and the vector path they build (its name, for the file name and the messages, and its
    vector bytes)."""

    units: dict[str, str]
    headers: dict[str, str]
    flags: tuple[str, ...]
    path: str
    width: int

    def identity(self, version: str) -> str:
        parts = [f"{name}\n{text}" for name, text in sorted({**self.units, **self.headers}.items())]
        return hashlib.sha256("\n".join([*parts, version, " ".join(self.flags), cpu_identity()]).encode()).hexdigest()


class CompileError(OSError):
    """The compiler rejected a source: the message names the compiler's first error line."""


def build(compiler: str, version: str, sources: Sources) -> tuple[Path, Path | None]:
    """The compiled library for these sources, compiler and CPU: from the cache, else compiled into it.

    Returns the library and a temporary folder to remove once it is loaded (None for a cached library):
    from a kernel cache that cannot be written, the library is compiled in a temporary folder, which can
    go once loaded (the loader keeps the file mapped).
    """
    prefix = f"{sources.path}-{sources.identity(version)}"
    directory = kernel_dir()
    shared = shared_folder(directory)
    key = _team_key() if shared else None
    if shared and key is None:
        return _compile_for_this_run(compiler, sources, directory,
                                     f"it {shared} and no team key (${KEY_ENV}) proves who wrote its libraries")
    for library in sorted(directory.glob(f"{prefix}.*.so")):
        if key is not None and not _signed(library, key):
            warn(f"compiled kernel {library} is not signed by the team key (the kernel cache {shared}); "
                 "not loaded, compiled again", key=str(library))
            continue
        if proven(library):
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
            built = compile_library(compiler, sources, Path(building))
            library = directory / f"{prefix}.{_content_hash(built)}.so"
            if key is not None:  # the signature first: a library is never trusted before it
                signature = Path(building) / "signature"
                signature.write_text(key.sign("kernel", library.name) + "\n")
                os.replace(signature, signature_of(library))
            os.replace(built, library)
        return library, None
    except CompileError:
        raise
    except OSError as error:  # full or read-only
        return _compile_for_this_run(compiler, sources, directory, f"it cannot be written ({error.strerror or error})")


def _compile_for_this_run(compiler: str, sources: Sources, directory: Path, reason: str) -> tuple[Path, Path]:
    scratch = Path(tempfile.mkdtemp(prefix=TEMPORARY_PREFIX))
    try:
        built = compile_library(compiler, sources, scratch)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    warn(f"the kernel cache {directory} is not used: {reason}; the native kernels are compiled "
         f"for this run only (set {KERNEL_CACHE} to a folder of your own)")
    return built, scratch


def compile_library(compiler: str, sources: Sources, folder: Path) -> Path:
    """Every unit compiled in `folder` (in parallel), then linked into folder/kernels.so."""
    for name, text in {**sources.headers, **sources.units}.items():
        (folder / name).write_text(text)
    environment = {**os.environ, "TMPDIR": str(folder)}
    commands = [[compiler, *sources.flags, "-fPIC", "-c", "-o", f"{name}.o", name] for name in sources.units]
    print(f"dabuild: compiling native kernels ({sources.path}, once per machine) ...", file=sys.stderr, flush=True)
    _run_all(commands, folder, environment, parallel=available_cores())
    objects = [f"{name}.o" for name in sources.units]
    _run_all([[compiler, *sources.flags, "-shared", "-o", "kernels.so", *objects]], folder, environment, parallel=1)
    return folder / "kernels.so"


def _run_all(commands: Sequence[list[str]], folder: Path, environment: dict[str, str], parallel: int) -> None:
    """Run the commands, `parallel` at a time, without a time limit; raise CompileError naming the first error
    line of the first that fails (the others are stopped)."""
    waiting = list(commands)
    running: list[tuple[list[str], subprocess.Popen[str]]] = []
    started = time.monotonic()
    reported = started
    try:
        while waiting or running:
            while waiting and len(running) < parallel:
                command = waiting.pop(0)
                running.append((command, subprocess.Popen(command, cwd=folder, env=environment, text=True,
                                                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)))
            command, process = running[0]
            try:
                _, errors = process.communicate(timeout=1.0)
            except subprocess.TimeoutExpired:
                if time.monotonic() - reported >= PROGRESS_SECONDS:
                    reported = time.monotonic()
                    print(f"dabuild: still compiling native kernels ({reported - started:.0f} s; a busy machine "
                          "compiles slowly) ...", file=sys.stderr, flush=True)
                running.append(running.pop(0))
                continue
            running.pop(0)
            if process.returncode:
                raise CompileError(f"{command[0]} failed on {command[-1]}: {first_error(errors)}")
    finally:
        for _, process in running:
            process.kill()
            process.wait()


def first_error(output: str) -> str:
    """The compiler's first error line (else its first line, else its silence said so)."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    return (errors or lines or ["no message"])[0]


def available_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _content_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _team_key() -> TeamKey | None:
    """`$DABUILD_CACHE_KEY`; a key too short to trust is none (the build reports it where it reads the key)."""
    try:
        return key_from(None)
    except ValueError:
        return None


def signature_of(library: Path) -> Path:
    return library.with_name(library.name + ".sig")


def _signed(library: Path, key: TeamKey) -> bool:
    """Did a team-key holder write this library? (Its name carries its content hash, which `proven` checks.)"""
    try:
        return key.verifies("kernel", library.name, signature_of(library).read_text().strip())
    except (OSError, UnicodeDecodeError):
        return False


def proven(library: Path) -> bool:
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


def cpu_identity() -> str:
    """What -march=native compiles for: the CPU's model and feature flags (Linux), else the platform's name."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return f"{platform.machine()} {platform.processor()}"
    wanted = ("model name", "flags", "Features", "CPU part")
    return "\n".join(sorted({line for line in lines if line.split(":")[0].strip() in wanted}))
