"""The C target: a C99 int8 library plus a test driver, proven by compiling and running it.

The artifact is plain source (model.h/.c, a header of shared integer helpers,
one header per layer holding its constants and its forward function, main.c,
Makefile, CMakeLists.txt) and a model.json manifest that `run` reads (it also
records the kernel of every layer and the arena's peak, lower bound and naive
sum). The generated code uses no malloc and, on the integer path, no libm;
activations live in one static arena planned by buffer liveness.

Built with -DDABUILD_TRACE, model_forward also hands every tensor a layer
writes to a hook, which main.c then defines to append it to a file per tensor:
`trace` builds that variant so a failed check can name the first layer that
diverges. Without the macro the hook calls are no code at all.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import ClassVar

import numpy as np
from pydantic import Field

from dabuild.capability import load_capability
from dabuild.errors import BuildError
from dabuild.quant.qgraph import QGraph
from dabuild.resources import data_dir
from dabuild.targets.base import Target
from dabuild.targets.c.codegen import PROGRAM, render, trace_file

MANIFEST = "model.json"
TRACE_PROGRAM = PROGRAM + "_trace"
TRACE_DIR = "trace"


def refuse_float_layers(qgraph: QGraph, capability_name: str) -> None:
    """BuildError naming the first fp32-fallback layer when the capability cannot run float."""
    capability = load_capability(data_dir("capabilities") / f"{capability_name}.yaml")
    if capability.fp32_fallback:
        return
    for layer in qgraph.layers:
        if getattr(layer, "computes_in_float", False):
            raise BuildError(f"node {layer.name!r} ({layer.float_op}) computes in float (a float island, or the "
                             f"layer feeding one), but target capability {capability.name!r} cannot run float "
                             "(fp32_fallback: false); quantize the island or build it for a target with fp32 "
                             "fallback")


class CTarget(Target):
    kind: ClassVar[str] = "c"
    capability: ClassVar[str] = "c"
    default_tolerance: ClassVar[str] = "exact"

    class Options(Target.Options):
        compiler: str = "cc"
        cflags: list[str] = Field(default_factory=lambda: ["-O2"])

    options: Options

    def _compiler_path(self) -> str:
        path = shutil.which(self.options.compiler)
        if path is None:
            raise BuildError(f"C compiler {self.options.compiler!r} was not found on PATH; install gcc or "
                             "clang, or set options.compiler of this target to a compiler that exists")
        return path

    def runtime_version(self) -> dict[str, str]:
        result = subprocess.run([self._compiler_path(), "--version"], capture_output=True, text=True)
        first_line = (result.stdout or result.stderr).strip().splitlines()
        return {self.options.compiler: first_line[0] if first_line else "unknown"}

    def programs(self) -> list[Path]:
        path = shutil.which(self.options.compiler)
        return [Path(path)] if path else []

    def export(self, qgraph: QGraph, out_dir: Path) -> None:
        refuse_float_layers(qgraph, self.capability)
        rendered = render(qgraph)
        out_dir = Path(out_dir)
        for name, text in rendered.files.items():
            (out_dir / name).write_text(text)
        manifest = {
            "program": PROGRAM,
            "sources": ["main.c", *rendered.library_sources],
            "input_size": qgraph.tensors[qgraph.input].size,
            "output_size": qgraph.tensors[qgraph.output].size,
            "arena_bytes": rendered.arena.peak_bytes,
            "arena": rendered.arena.report(),
            "kernels": rendered.kernels,
            "traced": [traced.manifest() for traced in rendered.traced],
        }
        (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")

    def _build_command(self, compiler: str, artifact_dir: Path, prefix: str, program: str) -> list[str]:
        """The compile line of the test program; sources are named `prefix/<file>`."""
        manifest = json.loads((artifact_dir / MANIFEST).read_text())
        return [compiler, "-std=c99", *self.options.cflags, "-o", program,
                *(f"{prefix}/{name}" for name in manifest["sources"])]

    def _compile(self, artifact_dir: Path, program: Path, defines: tuple[str, ...] = ()) -> None:
        command = self._build_command(self._compiler_path(), artifact_dir, str(artifact_dir), str(program))
        build = subprocess.run([command[0], *defines, *command[1:]], capture_output=True, text=True)
        if build.returncode != 0:
            raise BuildError(f"compiling the C artifact {artifact_dir} with {self.options.compiler!r} failed:\n"
                             f"{build.stderr.strip()}")

    def _execute(self, artifact_dir: Path, program: Path, inputs: np.ndarray, work_dir: Path,
                 *extra_arguments: str) -> np.ndarray:
        """Run a compiled test program on `inputs` (int8 samples); its outputs, one row per sample."""
        manifest = json.loads((artifact_dir / MANIFEST).read_text())
        samples = np.ascontiguousarray(inputs, dtype=np.int8).reshape(len(inputs), -1)
        if samples.shape[1] != manifest["input_size"]:
            raise BuildError(f"C artifact {artifact_dir} takes {manifest['input_size']} values per sample, "
                             f"got {samples.shape[1]}")
        inputs_file, outputs_file = work_dir / "inputs.bin", work_dir / "outputs.bin"
        samples.tofile(inputs_file)
        result = subprocess.run([str(program), str(inputs_file), str(outputs_file), *extra_arguments],
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise BuildError(f"the C test program of {artifact_dir} failed (exit {result.returncode}): "
                             f"{result.stderr.strip()}")
        return np.fromfile(outputs_file, dtype=np.int8).reshape(len(samples), manifest["output_size"])

    def run(self, artifact_dir: Path, inputs: np.ndarray, work_dir: Path) -> np.ndarray:
        artifact_dir, work_dir = Path(artifact_dir), Path(work_dir)
        program = work_dir / PROGRAM
        self._compile(artifact_dir, program)
        return self._execute(artifact_dir, program, inputs, work_dir)

    def trace(self, artifact_dir: Path, inputs: np.ndarray, work_dir: Path) -> dict[str, np.ndarray] | None:
        """Every tensor a layer writes (and the input), from the test program built with -DDABUILD_TRACE.

        The program appends each tensor's bytes as stored, some channels last; model.json's "traced"
        gives their shapes and memory orders, so they come back in the QGraph's (canonical) order.
        Zero-copy aliases and layout conversions are not traced. None for an artifact exported
        before tracing existed (its manifest lists no traced tensors).
        """
        artifact_dir, work_dir = Path(artifact_dir), Path(work_dir)
        traced = json.loads((artifact_dir / MANIFEST).read_text()).get("traced")
        if traced is None:
            return None
        program, trace_dir = work_dir / TRACE_PROGRAM, work_dir / TRACE_DIR
        trace_dir.mkdir()
        self._compile(artifact_dir, program, ("-DDABUILD_TRACE",))
        self._execute(artifact_dir, program, inputs, work_dir, str(trace_dir))
        values = {}
        for entry in traced:
            shape, order = entry["shape"], entry["order"]
            stored = np.fromfile(trace_dir / trace_file(entry["tensor"]), dtype=np.int8)
            stored = stored.reshape(len(inputs), *(shape[axis] for axis in order))
            values[entry["tensor"]] = stored.transpose(0, *(1 + order.index(axis) for axis in range(len(shape))))
        return values

    def rerun_script(self, artifact_dir: Path, inputs_file: str, outputs_file: str) -> str:
        name = Path(artifact_dir).name
        program = f"{name}/{PROGRAM}"
        return (shlex.join(self._build_command(self.options.compiler, Path(artifact_dir), name, program)) + "\n"
                + shlex.join([f"./{program}", inputs_file, outputs_file]) + "\n")
