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

Option `cpu` picks a profile (profiles.py): `host` runs the test program on
this machine; a Cortex-M profile cross-compiles, and `runner` says where the
image runs: `qemu` (the default; firmware.py boots it on the profile's board
with semihosting), `host` (the same sources built for this machine: their
portable paths, not the core's), or `command` (the user's own, e.g. flashing a
board: `{image}`, `{inputs}`, `{outputs}` in it are replaced, and it runs in
a scratch folder). Option `rounding` (`dabuild`, `tflm`, `tflm-single`) picks
how every requantization rounds, in the C and in the reference check runs, so
the C can equal TFLite Micro's (and CMSIS-NN's) integers. A Cortex-M export also measures the image (flash, RAM,
stack) into model.json, and `budget: {flash, ram}` fails the check naming
what overflows and by how much; a model bigger than the board's own memory
fails the export with the sizes (firmware.require_room). Option `streaming:
{hop}` builds a 1-D conv model to run once per hop (streaming.py): model_step,
model_reset and state buffers, model_forward streaming one window.
Option `patch` (`auto`, `off`, or a number of
layers) runs the first chain of convs a band of rows at a time (patch.py)
where that lowers the arena's peak by a tenth, never, or over that many layers;
model.json's arena gives the layer-by-layer plan beside it and what was patched.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from dabuild.errors import BuildError
from dabuild.ir.kernels.compiling import available_cores
from dabuild.qir.fixed_point import Rounding
from dabuild.qir.qgraph import QGraph
from dabuild.sizes import parse_size
from dabuild.targets.base import Target, held, refuse_float_layers, refuse_ops_without_integers
from dabuild.targets.c import cycles, firmware
from dabuild.targets.c.codegen import PROGRAM, WEIGHTS_FILE, StepBytes, render, stored_bytes, trace_file
from dabuild.targets.c.profiles import CPUS, FLOAT_ORDER, PROFILES, Profile
from dabuild.targets.c.streaming import graph_ops
from dabuild.targets.c.streaming import plan as plan_stream
from dabuild.targets.tflm_functions import tflm_lookups

MANIFEST = "model.json"
TRACE_PROGRAM = PROGRAM + "_trace"
TRACE_DIR = "trace"
FAILED_AT = re.compile(r"failed at sample (\d+)")  # main.c.j2's words for a sample model_forward refused


class Streaming(BaseModel):
    """Run a 1-D conv model on a stream (streaming.py): `hop` new frames a call, each conv over time keeping the
    frames it still needs in a state buffer."""

    model_config = ConfigDict(extra="forbid")
    hop: int = Field(1, ge=1)   # input frames per call of model_step


class Budget(BaseModel):
    """What the model may take on the device: flash (code, constants, initialised data) and RAM (data, bss with
    the arena, the stack of model_forward), in bytes or with a binary unit (dabuild.sizes: 64K = 64KB = 64KiB)."""

    model_config = ConfigDict(extra="forbid")
    flash: int | None = None
    ram: int | None = None

    @field_validator("flash", "ram", mode="before")
    @classmethod
    def _size(cls, value: Any) -> int | None:
        return None if value is None else parse_size(value)

    def overflows(self, measured: dict[str, int]) -> list[str]:
        """What exceeds the budget and by how much, in words."""
        found = []
        for name, limit in (("flash", self.flash), ("ram", self.ram)):
            used = measured.get(f"{name}_bytes")
            if limit is not None and used is not None and used > limit:
                found.append(f"{name} {used} bytes exceeds the budget of {limit} by {used - limit}")
        return found


def read_manifest(artifact_dir: Path) -> dict[str, Any]:
    """The artifact's model.json, read from disk once per version of the file (run, trace and measurements
    each need parts of it, batch after batch). Callers copy what they change."""
    stat = (Path(artifact_dir) / MANIFEST).stat()
    return _parsed_manifest(Path(artifact_dir) / MANIFEST, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=8)
def _parsed_manifest(path: Path, mtime_ns: int, size: int) -> dict[str, Any]:
    return json.loads(path.read_text())


def _function_shares(executions: list[cycles.Execution], disassembly: cycles.Disassembly,
                     timing: cycles.Timing | None) -> dict[str, dict[str, int]]:
    """Per function of the image (a layer's forward function, model_forward, a library call), the instructions
    and estimated cycles `executions` (one inference) spent in it, most first."""
    totals: dict[str, dict[str, int]] = {}
    for execution in executions:
        for name, share in cycles.by_function(execution, disassembly, timing).items():
            entry = totals.setdefault(name, {"instructions": 0})
            entry["instructions"] += share.instructions
            if share.cycles is not None:
                entry["estimated_cycles"] = entry.get("estimated_cycles", 0) + share.cycles
    return dict(sorted(totals.items(), key=lambda item: (-item[1].get("estimated_cycles", 0),
                                                         -item[1]["instructions"], item[0])))


def _tool_version(path: str) -> str:
    """The first line `path --version` prints: a compiler's or emulator's identity for cache keys."""
    result = subprocess.run([path, "--version"], check=False, capture_output=True, text=True)
    first_line = (result.stdout or result.stderr).strip().splitlines()
    return first_line[0] if first_line else "unknown"


class CTarget(Target):
    kind: ClassVar[str] = "c"
    capability: ClassVar[str] = "c"
    default_tolerance = "exact"
    float_order = ("the reference's: each island sum from 0 in the C loops' order, every product "
                   "and sum rounded to float32 (-ffp-contract=off), so islands are exact")
    size_options = ("cpu",)   # the profile's layout (the -O2 kernel choice: cflags stay out of the tune key)

    class Options(Target.Options):
        cpu: Literal[CPUS] = "host"  # type: ignore[valid-type]
        compiler: str | None = None   # default: the profile's (cc, or arm-none-eabi-gcc for Cortex-M)
        cflags: list[str] = Field(default_factory=lambda: ["-O2"])   # after the profile's own flags
        runner: Literal["qemu", "host", "command"] | None = None   # default: host, or qemu for Cortex-M
        command: list[str] | None = None   # runner command: argv with {image}, {inputs}, {outputs}
        timeout: float = 600.0   # seconds one emulator or command run may take
        budget: Budget | None = None
        rounding: Rounding = "dabuild"   # how requantization rounds: dabuild's, or TFLite Micro's (fixed_point)
        # patch-based execution of the first convs (patch.py): where it lowers the peak, never, or N layers
        patch: Literal["auto", "off"] | Annotated[int, Field(ge=2)] = "auto"
        streaming: Streaming | None = None   # `true` or {hop: N}: model_step per hop (streaming.py)

        @field_validator("streaming", mode="before")
        @classmethod
        def _streaming_flag(cls, value: Any) -> Any:
            return ({} if value else None) if isinstance(value, bool) else value

        @model_validator(mode="after")
        def _consistent(self) -> CTarget.Options:
            if self.runner == "command" and not self.command:
                raise ValueError("runner: command needs options.command, the argv that runs {image} on "
                                 "{inputs} and writes {outputs}")
            if self.command and self.runner != "command":
                raise ValueError("options.command is only used with runner: command")
            if self.budget is not None and self.cpu == "host":
                raise ValueError("a budget is measured on a Cortex-M image; set options.cpu (e.g. cortex-m4)")
            return self

    options: Options

    @property
    def profile(self) -> Profile:
        """The cpu's profile, its compiler replaced by options.compiler, `for_size` when the last -O of cflags
        asks for size."""
        profile = PROFILES[self.options.cpu]
        levels = [flag for flag in self.options.cflags if flag.startswith("-O")]
        return dataclasses.replace(profile, compiler=self.options.compiler or profile.compiler,
                                   for_size=bool(levels) and levels[-1] in ("-Os", "-Oz"))

    @property
    def hop(self) -> int | None:
        """Input frames per call of a streaming artifact; None: it runs whole windows."""
        return self.options.streaming.hop if self.options.streaming else None

    @property
    def runner(self) -> str:
        return self.options.runner or ("qemu" if self.profile.cortex_m else "host")

    @property
    def compiler(self) -> str:
        """The compiler of the program `run` builds: the profile's, or this machine's for runner host."""
        if self.profile.cortex_m and self.runner == "host":
            return "cc"
        return self.profile.compiler

    def _compiler_path(self) -> str:
        path = shutil.which(self.compiler)
        if path is None:
            packages = f"the Debian packages {firmware.ARM_PACKAGES}" if "arm-none-eabi" in self.compiler \
                else "gcc or clang"
            raise BuildError(f"C compiler {self.compiler!r} was not found on PATH; install {packages}, or set "
                             "options.compiler of this target to a compiler that exists")
        return path

    def _tools(self) -> list[str]:
        tools = [self.compiler]
        if self.profile.cortex_m and self.runner == "qemu":
            tools.append(firmware.QEMU)
        return tools

    def runtime_version(self) -> dict[str, str]:
        versions = {}
        for tool in self._tools():
            path = self._compiler_path() if tool == self.compiler else firmware.require(tool, firmware.QEMU_PACKAGE)
            versions[tool] = _tool_version(path)
        return versions

    def programs(self) -> list[Path]:
        return [Path(path) for path in map(shutil.which, self._tools()) if path]

    def export_tools(self) -> dict[str, str]:
        """A Cortex-M export links a firmware image with the cross compiler to measure flash, RAM and stack
        (model.json), so that compiler's identity is part of what it depends on."""
        if not self.profile.cortex_m:
            return {}
        return {self.profile.compiler: _tool_version(firmware.require(self.profile.compiler, firmware.ARM_PACKAGES))}

    def export_programs(self) -> list[Path]:
        path = shutil.which(self.profile.compiler) if self.profile.cortex_m else None
        return [Path(path)] if path else []

    def refuse(self, graph: Any, integer_forms: Mapping[str, frozenset[str]]) -> None:
        """Every op the C kernels cannot run, by node, before calibration and tuning spend any time (an op
        without an integer form is fine where it can be a float island: in float_ops, on a core with an FPU)."""
        capability = self.capability_spec
        float_ops = (capability.float_ops or []) if capability.fp32_fallback else []
        refuse_ops_without_integers(graph, self.kind, self.layer_types(), integer_forms, float_ops)
        if self.hop is not None:   # NotStreamable (exit 2) naming the first layer that looks ahead or mixes frames
            ops, shapes = graph_ops(graph)
            if None not in shapes[graph.inputs[0].name]:   # else export judges it, its shapes known
                plan_stream(ops, shapes, graph.inputs[0].name, graph.outputs[0], self.hop, "the model")

    @classmethod
    def layer_types(cls) -> frozenset[str]:
        from dabuild.targets.c.kernels import KERNELS

        return frozenset(key.split("/", 1)[0] for key in held(KERNELS) if not key.startswith(":"))

    @classmethod
    def float_ops(cls) -> frozenset[str]:
        from dabuild.targets.c.kernels.island import FLOAT_OPS

        return frozenset(FLOAT_OPS)

    @classmethod
    def refuses_float_islands(cls, options: dict[str, Any]) -> str | None:
        cpu = options.get("cpu") or "host"
        if cpu in PROFILES and not PROFILES[cpu].fpu:
            return f"cpu {cpu!r} has no FPU"
        return None

    def integer_graph(self, qgraph: QGraph) -> QGraph:
        """The QGraph with the option's rounding; with a TFLM rounding, sigmoid, tanh and hard_swish tables as TFLM
        computes them too (`tflm_functions`), so an imported .tflite's table activations equal TFLM's."""
        if self.options.rounding != "dabuild":
            qgraph = tflm_lookups(qgraph)
        return dataclasses.replace(qgraph, rounding=self.options.rounding)

    def stored_bytes(self, qgraph: QGraph) -> int:
        """The bytes this profile's artifact stores for weights and parameters, from its kernels' constants: int8
        weights on a Cortex-M (int4 ones packed two a byte), the host's int16 conv weights, narrowest-type
        biases and requantization constants. What tuning objective `size` minimises; each distinct kernel step is
        laid out once while this target lives (`StepBytes`), as a search prices configs that share most of them."""
        return stored_bytes(qgraph, self.profile, self._step_bytes)

    @functools.cached_property
    def _step_bytes(self) -> StepBytes:
        return StepBytes()

    def export(self, qgraph: QGraph, out_dir: Path) -> None:
        refuse_float_layers(qgraph, self.capability_spec, None if self.profile.fpu else f"cpu {self.profile.name!r} has no FPU")
        profile = self.profile
        rendered = render(qgraph, profile, self.hop, self.options.patch)
        out_dir = Path(out_dir)
        for name, text in rendered.files.items():
            (out_dir / name).parent.mkdir(parents=True, exist_ok=True)
            if isinstance(text, bytes):
                (out_dir / name).write_bytes(text)
            else:
                (out_dir / name).write_text(text)
        manifest = {
            "program": PROGRAM,
            "sources": ["main.c", *rendered.library_sources],
            "input_size": qgraph.tensors[qgraph.input].size,
            "input_dtype": qgraph.input_params.storage,  # int32 for token ids
            "output_size": qgraph.tensors[qgraph.output].size,
            "output_dtype": qgraph.output_params.storage,   # int16 for 16-bit activations
            "output_shape": list(qgraph.tensors[qgraph.output].shape),
            "arena_bytes": rendered.arena.peak_bytes,
            "arena": rendered.memory,
            "kernels": rendered.kernels,
            **({"streaming": rendered.streamed.manifest()} if rendered.streamed else
               {"traced": [traced.manifest() for traced in rendered.traced]}),
            "cpu": profile.name,
            "assembler_flags": ["-I"] if WEIGHTS_FILE in rendered.files else [],  # .incbin finds weights.bin
            "weight_bytes": rendered.weight_bytes,
        }
        if profile.cortex_m:
            state = rendered.streamed.state_bytes if rendered.streamed else 0
            firmware.require_room(profile, out_dir, {"arena": rendered.arena.peak_bytes, "streaming state": state,
                                                     "reserve for heap and stack": firmware.STACK_RESERVE},
                                  {"constants": rendered.weight_bytes})
            with tempfile.TemporaryDirectory(prefix="dabuild-image-") as work:
                image = firmware.build_image(profile, self.options.cflags, out_dir, Path(work))
                assert profile.board is not None  # a cortex_m profile names its qemu board
                measured = firmware.measure(image)
                manifest["firmware"] = {"board": profile.board.machine, **measured}
            firmware.require_room(profile, out_dir,
                                  {"data": measured["data_bytes"], "bss (arena, state)": measured["bss_bytes"],
                                   "stack of model_forward": measured["stack_bytes"]},
                                  {"text": measured["text_bytes"], "rodata": measured["rodata_bytes"],
                                   "data": measured["data_bytes"]})
        (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")

    def _build_command(self, compiler: str, artifact_dir: Path, prefix: str, program: str) -> list[str]:
        """The compile line of the host test program; sources are named `prefix/<file>`."""
        manifest = read_manifest(artifact_dir)
        flags = list(FLOAT_ORDER) if self.profile.cortex_m else list(self.profile.flags)
        flags += [f"-Wa,{flag}{prefix}" for flag in manifest.get("assembler_flags", [])]
        return [compiler, "-std=c99", *flags, *self.options.cflags, "-o", program,
                *(f"{prefix}/{name}" for name in manifest["sources"])]

    def _build(self, artifact_dir: Path, work_dir: Path, defines: tuple[str, ...] = ()) -> Path:
        """The test program (host) or image (qemu, command) of the artifact, built in `work_dir`."""
        if self.runner != "host":
            return firmware.build_image(self.profile, self.options.cflags, artifact_dir, work_dir / "image",
                                        defines).elf
        program = work_dir / (TRACE_PROGRAM if defines else PROGRAM)
        command = self._build_command(self._compiler_path(), artifact_dir, str(artifact_dir), str(program))
        build = subprocess.run([command[0], *defines, *command[1:]], check=False, capture_output=True, text=True)
        if build.returncode != 0:
            raise BuildError(f"compiling the C artifact {artifact_dir} with {self.compiler!r} failed:\n"
                             f"{build.stderr.strip()}")
        return program

    def _execute(self, artifact_dir: Path, program: Path, inputs: np.ndarray, work_dir: Path,
                 traced: bool = False, first: int = 0) -> np.ndarray:
        """Run a built test program or image on `inputs` (int8 samples, or int32 token ids, all in one run); its
        outputs, one row per sample. It reads work_dir/inputs.bin and writes work_dir/outputs.bin (and work_dir/trace/).
        `first`: the index of inputs[0] among the samples checked, so that a failure names the sample a user
        gave, not its place in one part's slice."""
        manifest = read_manifest(artifact_dir)
        samples = np.ascontiguousarray(inputs, dtype=manifest.get("input_dtype", "int8")).reshape(len(inputs), -1)
        if samples.shape[1] != manifest["input_size"]:
            raise BuildError(f"C artifact {artifact_dir} takes {manifest['input_size']} values per sample, "
                             f"got {samples.shape[1]}")
        inputs_file, outputs_file = work_dir / "inputs.bin", work_dir / "outputs.bin"
        samples.tofile(inputs_file)
        if self.runner == "qemu":
            firmware.run_image(self.profile, program, work_dir, self.options.timeout)
        else:
            if self.runner == "host":
                line = [str(program), str(inputs_file), str(outputs_file)]
                line += [str(work_dir / TRACE_DIR)] if traced else []
            else:
                places = {"image": str(program), "inputs": str(inputs_file), "outputs": str(outputs_file)}
                line = [argument.format(**places) for argument in self.options.command or []]
            try:
                result = subprocess.run(line, check=False, capture_output=True, text=True, cwd=work_dir,
                                        timeout=self.options.timeout)
            except subprocess.TimeoutExpired:
                raise BuildError(f"the C test program of {artifact_dir} did not finish within "
                                 f"{self.options.timeout:g} s") from None
            if result.returncode != 0:
                said = FAILED_AT.sub(lambda found: f"failed at sample {first + int(found[1])}", result.stderr.strip())
                raise BuildError(f"the C test program of {artifact_dir} failed (exit {result.returncode}): {said}")
        output_dtype = np.dtype(manifest.get("output_dtype", "int8"))
        if (not outputs_file.exists()
                or outputs_file.stat().st_size != len(samples) * manifest["output_size"] * output_dtype.itemsize):
            raise BuildError(f"the C test program of {artifact_dir} wrote no outputs for all {len(samples)} samples "
                             f"to {outputs_file}")
        return np.fromfile(outputs_file, dtype=output_dtype).reshape(len(samples), manifest["output_size"])

    def fits(self, qgraph: QGraph) -> str | None:
        """With a budget: the artifact exported and linked for the profile, and what of it overflows."""
        if self.options.budget is None:
            return None
        with tempfile.TemporaryDirectory(prefix="dabuild-fit-") as work:
            try:
                self.export(qgraph, Path(work))
            except firmware.BoardOverflow as overflow:
                return f"{self.options.cpu}: {overflow}"
            measured = read_manifest(Path(work))["firmware"]
        overflows = self.options.budget.overflows(measured)
        return f"{self.options.cpu}: " + "; ".join(overflows) if overflows else None

    def _check_budget(self, artifact_dir: Path) -> None:
        budget = self.options.budget
        if budget is None:
            return
        measured = read_manifest(artifact_dir).get("firmware", {})
        overflows = budget.overflows(measured)
        if overflows:
            raise BuildError(f"the {self.profile.name} build of {artifact_dir} does not fit its budget: "
                             + "; ".join(overflows))

    def run(self, artifact_dir: Path, inputs: np.ndarray, work_dir: Path) -> np.ndarray:
        """The program's outputs in the reference's shape (batch, *output shape), whatever their rank."""
        artifact_dir, work_dir = Path(artifact_dir), Path(work_dir)
        self._check_budget(artifact_dir)
        program = self._build(artifact_dir, work_dir)
        parts = available_cores() if self.runner == "host" else 1
        rows = self._execute_in_parts(artifact_dir, program, inputs, work_dir, parts)
        shape = read_manifest(artifact_dir)["output_shape"]
        return rows.reshape(len(rows), *shape)

    def _execute_in_parts(self, artifact_dir: Path, program: Path, inputs: np.ndarray, work_dir: Path,
                          parts: int) -> np.ndarray:
        """`_execute` over consecutive slices of `inputs`, up to `parts` programs at once, each in a folder of
        its own; their rows in the samples' order. The test program is single-threaded and every sample's
        outputs depend on that sample alone, so the split changes no bit and a check on N cores takes 1/N of
        the time. Only the host runner splits: an image under qemu or the user's command (a board) runs once."""
        parts = max(1, min(parts, len(inputs)))
        if parts == 1:
            return self._execute(artifact_dir, program, inputs, work_dir)
        bounds = np.linspace(0, len(inputs), parts + 1).astype(int)
        folders = [work_dir / f"part-{index}" for index in range(parts)]
        for folder in folders:
            folder.mkdir(exist_ok=True)
        with ThreadPoolExecutor(parts, thread_name_prefix="dabuild-c-check") as pool:  # each waits on a process
            rows = pool.map(lambda index: self._execute(artifact_dir, program, inputs[bounds[index]:bounds[index + 1]],
                                                        folders[index], first=int(bounds[index])), range(parts))
            return np.concatenate(list(rows))

    def measurements(self, artifact_dir: Path, inputs: np.ndarray, work_dir: Path) -> dict[str, Any]:
        """model.json's firmware figures, and under qemu the instructions model_forward retires on the first
        sample (a counting image: -DDABUILD_COUNT), by timing class, with the cycles they would take on a core
        whose timing dabuild.targets.c.cycles models (flash wait states not included); a streaming model's
        also those of one hop past the warm-up; and the patched stage, if any, with the arena's peak beside the
        layer-by-layer one."""
        artifact_dir, work_dir = Path(artifact_dir), Path(work_dir)
        manifest = read_manifest(artifact_dir)
        measured = dict(manifest.get("firmware", {}))
        streaming = manifest.get("streaming")
        if streaming and measured:
            measured["state_bytes"] = streaming["state_bytes"]   # part of ram_bytes (bss)
        if self.runner == "qemu" and len(inputs):
            image = self._build(artifact_dir, work_dir, ("-DDABUILD_COUNT",))
            dtype = manifest.get("input_dtype", "int8")
            np.ascontiguousarray(inputs[:1], dtype=dtype).tofile(work_dir / "inputs.bin")
            disassembly = cycles.disassemble(image)
            executions = firmware.trace_executions(self.profile, image, work_dir, self.options.timeout, disassembly)
            timing = cycles.TIMINGS.get(self.profile.name)
            estimates = [cycles.estimate(execution, disassembly[0], timing) if timing is not None else None
                         for execution in executions]
            inference = 1
            if streaming:   # a mark pair per hop: the last hop of the first window is past the warm-up
                inference = streaming["calls_per_window"]
                measured["instructions_per_hop"] = executions[inference - 1].instructions
                hop = estimates[inference - 1]
                if hop is not None:
                    measured["estimated_cycles_per_hop"] = hop.cycles
            measured["instructions_per_inference"] = sum(execution.instructions for execution in executions[:inference])
            window = [estimate for estimate in estimates[:inference] if estimate is not None]
            if window:
                measured["estimated_cycles_per_inference"] = sum(estimate.cycles for estimate in window)
                measured["instruction_classes"] = {kind: sum(estimate.classes.get(kind, 0) for estimate in window)
                                                   for kind in sorted({kind for e in window for kind in e.classes})}
            measured["functions"] = _function_shares(executions[:inference], disassembly, timing)
        report: dict[str, Any] = {"firmware": measured} if measured else {}
        arena = manifest.get("arena", {})
        if arena.get("patch"):
            report["patch"] = {**arena["patch"], "peak_bytes": arena["peak_bytes"],
                               "layer_by_layer_peak_bytes": arena["layer_by_layer"]["peak_bytes"]}
        return report

    def trace(self, artifact_dir: Path, inputs: np.ndarray, work_dir: Path) -> dict[str, np.ndarray] | None:
        """Every tensor a layer writes (and the input), from the test program built with -DDABUILD_TRACE.

        The program appends each tensor's bytes as stored, some channels last (a float island's as float32);
        model.json's "traced" gives their shapes, memory orders and types, so they come back in the QGraph's (canonical) order.
        Zero-copy aliases and layout conversions are not traced. None for an artifact exported
        before tracing existed (its manifest lists no traced tensors), and for a user's runner command.
        """
        artifact_dir, work_dir = Path(artifact_dir), Path(work_dir)
        traced = read_manifest(artifact_dir).get("traced")
        if traced is None or self.runner == "command":
            return None
        (work_dir / TRACE_DIR).mkdir()
        program = self._build(artifact_dir, work_dir, ("-DDABUILD_TRACE",))
        self._execute(artifact_dir, program, inputs, work_dir, traced=True)
        values = {}
        for entry in traced:
            shape, order = entry["shape"], entry["order"]
            stored = np.fromfile(work_dir / TRACE_DIR / trace_file(entry["tensor"]), dtype=entry.get("dtype", "int8"))
            stored = stored.reshape(len(inputs), *(shape[axis] for axis in order))
            values[entry["tensor"]] = stored.transpose(0, *(1 + order.index(axis) for axis in range(len(shape))))
        return values

    def rerun_script(self, artifact_dir: Path, inputs_file: str, outputs_file: str) -> str:
        name = Path(artifact_dir).name
        if self.runner == "host":
            program = f"{name}/{PROGRAM}"
            return (shlex.join(self._build_command(self.compiler, Path(artifact_dir), name, program)) + "\n"
                    + shlex.join([f"./{program}", inputs_file, outputs_file]) + "\n")
        lines = [["mkdir", "-p", "image"], *firmware.compile_lines(self.profile, self.options.cflags, name, "image"),
                 ["cp", inputs_file, "image/inputs.bin"]]
        if self.runner == "qemu":
            run = ["sh", "-c", "cd image && " + shlex.join(firmware.qemu_line(self.profile, "image.elf"))]
        else:
            places = {"image": "image/image.elf", "inputs": "image/inputs.bin", "outputs": "image/outputs.bin"}
            run = [argument.format(**places) for argument in self.options.command or []]
        return "\n".join(shlex.join(line) for line in [*lines, run, ["cp", "image/outputs.bin", outputs_file]]) + "\n"
