"""Render a QGraph into C99 sources with the Jinja2 templates of this package.

One translation unit holds the model: model.c includes a header per layer
(its constants and its forward function, every size a literal) and calls
them in schedule order on the arena, `in` and `out`.
"""

from __future__ import annotations

import dataclasses
import re
import string
from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import jinja2
import numpy as np

import dabuild
from dabuild.errors import BuildError
from dabuild.names import unique_name
from dabuild.qir.content import ContentKeys
from dabuild.qir.qgraph import QGraph
from dabuild.targets.c.arena import ArenaPlan, plan_arena
from dabuild.targets.c.firmware import LINKER_SCRIPT, STACK_RESERVE, STARTUP
from dabuild.targets.c.kernels import Step
from dabuild.targets.c.layout import Storage
from dabuild.targets.c.literals import c_float, c_floats
from dabuild.targets.c.patch import Patch, chains, patch
from dabuild.targets.c.profiles import HOST, PROFILES, Profile
from dabuild.targets.c.program import Program, build_program
from dabuild.targets.c.streaming import Plan as StreamPlan
from dabuild.targets.c.streaming import plan_stream, step_qgraph, stream_context, warmup_fill

PROGRAM = "model_test"
WEIGHTS_FILE, WEIGHTS_FALLBACK = "weights.bin", "weights.inc"
COMMON_HEADER = "dabuild_kernels.h"
WIDE_HEADER = "dabuild_wide.h"   # the 16-bit activation kernels' requantization
_TEMPLATES = Path(__file__).parent / "templates"


def c_array(values: np.ndarray, per_line: int = 16) -> str:
    """Array initialiser body: comma-separated integers, `per_line` to a line."""
    flat = [str(int(v)) for v in np.asarray(values).ravel()]
    lines = [", ".join(flat[i:i + per_line]) for i in range(0, len(flat), per_line)]
    return ",\n".join("    " + line for line in lines)


KEPT_TYPES = ("int8", "int16", "uint8", "uint16")   # a kernel chose these element types (int16 pmaddwd weights)


def c_type(values: np.ndarray) -> str:
    """The C element type of a constant array: float for float32 (a float island's constants), its own when a
    kernel chose a narrow one, else the narrowest of int8_t, int16_t and int32_t that holds every value
    (constants take no more flash than they need); int64_t for the wide biases of blocked_dense (C99 types an
    unsuffixed decimal constant beyond long as long long, so the literals need no suffix)."""
    array = np.asarray(values)
    if array.dtype == np.float32:
        return "float"
    if array.dtype.name in KEPT_TYPES:
        return f"{array.dtype.name}_t"
    low, high = (int(array.min()), int(array.max())) if array.size else (0, 0)
    for bits in (8, 16, 32, 64):
        if -(1 << (bits - 1)) <= low and high < 1 << (bits - 1):
            return f"int{bits}_t"
    raise ValueError(f"constants from {low} to {high} do not fit int64")


def c_identifier(name: str, taken: set[str], prefix: str = "l_") -> str:
    """A unique C identifier for a layer or tensor name ('dense/1' -> 'l_dense_1')."""
    return unique_name(prefix + re.sub(r"[^0-9A-Za-z_]", "_", name).lower(), taken)


def c_comment(text: str) -> str:
    """Text safe inside a /* */ comment."""
    return text.replace("*/", "* /")


def c_string(text: str) -> str:
    """A C string literal of `text`'s UTF-8 bytes: printable ASCII as is, the rest as octal escapes
    (`?` escaped too, so no trigraph forms)."""
    def char(byte: int) -> str:
        if chr(byte) in '"\\?':
            return "\\" + chr(byte)
        return chr(byte) if 0x20 <= byte < 0x7F else f"\\{byte:03o}"
    return '"' + "".join(char(byte) for byte in text.encode()) + '"'


_PLAIN = frozenset((string.ascii_letters + string.digits + "_-.").encode())


def trace_file(tensor: str) -> str:
    """The file a trace build of main.c appends `tensor`'s bytes to (as its `dabuild_trace` names it): the
    UTF-8 name with every byte but ASCII letters, digits, `_`, `-` and `.` percent-encoded, so each name has
    its own file and none reaches outside the trace folder."""
    return "".join(chr(b) if b in _PLAIN else f"%{b:02X}" for b in tensor.encode()) + ".bin"


@dataclass(frozen=True)
class Traced:
    """A tensor a trace build reports after the step that writes it, in the storage it has there."""

    tensor: str
    storage: Storage
    dtype: str = "int8"   # float32: a float island's tensor

    @property
    def bytes(self) -> int:
        return self.storage.size * np.dtype(self.dtype).itemsize

    def manifest(self) -> dict[str, Any]:
        return {"tensor": self.tensor, "shape": list(self.storage.shape), "order": list(self.storage.order),
                "dtype": self.dtype}


def c_bytes(values: np.ndarray) -> int:
    """Bytes a constant array takes in the artifact (its c_type's width per element)."""
    kind = c_type(values)
    return int(np.asarray(values).size) * (4 if kind == "float" else int(re.sub(r"\D", "", kind)) // 8)


def constant_bytes(context: dict[str, Any]) -> int:
    """Bytes of the constant arrays in a kernel's template context (every array there is one)."""
    arrays = [v for v in context.values() if isinstance(v, np.ndarray)]
    arrays += [a for v in context.values() if isinstance(v, list) for a in v if isinstance(a, np.ndarray)]
    return sum(c_bytes(array) for array in arrays)


@dataclass(frozen=True)
class Rendered:
    files: dict[str, str | bytes]   # file name -> text (weights.bin: bytes)
    library_sources: list[str]  # .c files of the model library (main.c excluded)
    arena: ArenaPlan
    memory: dict[str, Any]      # the arena's report: with the layer-by-layer plan and the patched stage, if any
    kernels: dict[str, str]     # step name -> kernel name
    traced: list[Traced]        # input, then layer outputs in schedule order; no aliases or layout conversions
    weight_bytes: int           # bytes of every constant array: weights, biases, requantization, tables
    streamed: StreamPlan | None = None   # a streaming artifact's plan (its state buffers)


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(_TEMPLATES), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                             autoescape=False)
    env.filters["c_array"] = c_array
    env.filters["c_type"] = c_type
    env.filters["c_floats"] = c_floats
    env.filters["c_comment"] = c_comment
    env.filters["c_string"] = c_string
    return env


def scratch_name(step: Step) -> str:
    return f"{step.name}:scratch"


def window_name(stage: Patch, index: int) -> str:
    return f"{stage.name}:window{index}"


def plan_memory(program: Program, stage: Patch | None = None) -> ArenaPlan:
    """Liveness over the steps of every buffer but `in` and `out`, scratch buffers alive during their step;
    a float island's buffers take 4 bytes a value and 16-bit activations 2, at word-aligned offsets.

    A patched `stage` is one step: it reads its first layer's input and writes its last layer's output, its
    windows and its one scratch; the tensors between its layers take no arena at all."""
    sizes = {program.buffer[name]: program.storage[name].size * program.element_bytes(program.buffer[name])
             for name in program.storage}
    schedule = []
    scratch = set()
    inside = range(stage.first, stage.first + len(stage.steps) - 1) if stage else range(0)
    for index, step in enumerate(program.steps):
        if index in inside:
            continue
        source = program.steps[stage.first] if stage and index == stage.last else step
        reads = [program.buffer[o.name] for o in source.inputs if not o.constant]
        writes = [program.buffer[o.name] for o in step.outputs]
        if stage and index == stage.last:
            for number, size in enumerate(stage.windows):
                sizes[window_name(stage, number)] = size
                writes.append(window_name(stage, number))
        work = stage.scratch_bytes if stage and index == stage.last else step.scratch_bytes
        if work:
            sizes[scratch_name(step)] = work
            writes.append(scratch_name(step))
            scratch.add(scratch_name(step))
        schedule.append((reads, writes))
    return plan_arena(schedule, sizes, external={program.input, program.output, *program.states},
                      wide=frozenset(scratch),
                      words=program.floats | program.halves)


PATCHING = Literal["auto", "off"] | int   # the c target's option `patch`: decide, never, or this many layers


@dataclass(frozen=True)
class Plan:
    """The arena, with the patched stage it assumes (None: layer by layer), and the layer-by-layer plan beside it."""

    program: Program   # its steps banded where the stage runs
    arena: ArenaPlan
    stage: Patch | None
    layer_by_layer: ArenaPlan

    def report(self) -> dict[str, Any]:
        return {**self.arena.report(), "layer_by_layer": self.layer_by_layer.report(),
                "patch": self.stage.report() if self.stage else None}


MIN_SAVING = 0.1   # `auto` patches where that saves this share of the layer-by-layer peak at least


def plan(program: Program, patching: PATCHING = "auto") -> Plan:
    """The arena of the program, with the first chain of convs patched (patch.py) where that lowers the peak
    (`auto`: every depth from two layers on is planned and the lowest peak kept, the shallower on a tie), never
    (`off`), or over exactly `patching` layers.

    `auto` keeps a patched plan only if it saves MIN_SAVING of the peak: a patched stage costs instructions (a
    call per layer per band, the windows' memmoves, pointwise convs row by row where they ran as one long row),
    which KWS's 1.8 % and IC's 3.2 % would not buy (KWS: 6 % more instructions on M4, 18 % on M55)."""
    layer_by_layer = plan_memory(program)
    best = Plan(program, layer_by_layer, None, layer_by_layer)
    runs = chains(program) if patching != "off" else []
    if not runs:
        if isinstance(patching, int):
            raise BuildError(f"option patch: {patching}, but the model has no chain of two or more 2-D convs "
                             "each reading only the one before it")
        return best
    run = runs[0]
    if isinstance(patching, int) and not 2 <= patching <= len(run):
        raise BuildError(f"option patch: {patching}, but the first chain of convs has {len(run)} layers "
                         f"({program.steps[run[0]].name} .. {program.steps[run[-1]].name}); give 2 to {len(run)}")
    for depth in [patching] if isinstance(patching, int) else range(2, len(run) + 1):
        stage = patch(program, run[:depth])
        banded = dataclasses.replace(program, steps=[*program.steps[:stage.first], *stage.steps,
                                                     *program.steps[stage.last + 1:]])
        arena = plan_memory(banded, stage)
        if isinstance(patching, int) or arena.peak_bytes < best.arena.peak_bytes:
            best = Plan(banded, arena, stage, layer_by_layer)
    if patching == "auto" and best.arena.peak_bytes > (1 - MIN_SAVING) * layer_by_layer.peak_bytes:
        return Plan(program, layer_by_layer, None, layer_by_layer)
    return best


BLOB_THRESHOLD = 1 << 20   # weights of this many bytes or more leave the C source for weights.bin
BLOB_ALIGNMENT = 16


def weight_blob(contexts: list[dict[str, Any]], threshold: int | None = None) -> bytes:
    """The weight arrays of a large model as one binary file, each at an offset its context now names
    (`weight_offset`); empty (every array stays a C initialiser) below `threshold` bytes in all.

    Written as integer initialisers, weights take 4 to 5 source bytes each and the compiler parses them
    slowly; a ResNet-50 would be hundreds of megabytes of C. As a binary file the assembler pulls in
    with `.incbin` they cost no source at all (model.c falls back to string literals in weights.inc where
    the compiler is not GNU C on ELF).
    """
    weighted = [c for c in contexts if isinstance(c.get("weight"), np.ndarray)]
    if sum(c["weight"].nbytes for c in weighted) < (BLOB_THRESHOLD if threshold is None else threshold) or not weighted:
        return b""
    chunks: list[bytes] = []
    offset = 0
    for context in weighted:
        stored = np.ascontiguousarray(context["weight"], dtype=np.dtype(c_type(context["weight"])[:-2]).newbyteorder("<"))
        context["weight_offset"] = offset
        padded = stored.tobytes() + bytes(-stored.nbytes % BLOB_ALIGNMENT)
        chunks.append(padded)
        offset += len(padded)
    return b"".join(chunks)


OCTAL_ESCAPES = np.array([list(f"\\{byte:03o}".encode()) for byte in range(256)], dtype=np.uint8)  # (256, 4)


def string_literal_lines(data: bytes, per_line: int = 32) -> str:
    """`data` as adjacent C string literals of octal escapes (exactly len(data) chars, no terminating NUL
    needed by a char array of that size), `per_line` bytes a line.

    Each byte's escape is looked up in a table by numpy, a line at a time: a ResNet-50's 25 MB of weights
    take a second, where formatting byte by byte in Python took most of a minute."""
    escapes = OCTAL_ESCAPES[np.frombuffer(data, dtype=np.uint8)]
    full = len(data) // per_line * per_line
    lines = [_quoted_lines(escapes[:full].reshape(-1, per_line * 4))] if full else []
    if full < len(data):
        lines.append(_quoted_lines(escapes[full:].reshape(1, -1)))
    return "\n".join(lines)


def _quoted_lines(escapes: np.ndarray) -> str:
    """Rows of escape characters, each as `    "<row>"`, joined by newlines (none after the last)."""
    opening, closing = np.frombuffer(b'    "', dtype=np.uint8), np.frombuffer(b'"\n', dtype=np.uint8)
    rows = np.concatenate([np.broadcast_to(opening, (len(escapes), len(opening))), escapes,
                           np.broadcast_to(closing, (len(escapes), len(closing)))], axis=1)
    return rows.tobytes()[:-1].decode("ascii")


def render(qgraph: QGraph, profile: Profile = PROFILES[HOST], hop: int | None = None,
           patching: PATCHING = "auto") -> Rendered:
    """The artifact's files; with `hop`, a streaming one (streaming.py): model_step runs `hop` new frames, and
    model_forward runs a whole window through it. `patching`: the option `patch` (see `plan`)."""
    env = _environment()
    version = dabuild.__version__
    window_graph, streamed = qgraph, None
    if hop is not None:
        streamed = plan_stream(qgraph, hop)
        qgraph = step_qgraph(qgraph, streamed)
    planned = plan(build_program(qgraph, profile, {window.layer: window for window in streamed.windows}
                                 if streamed else None), patching)
    program, arena, stage = planned.program, planned.arena, planned.stage
    wide_input = qgraph.takes_indices or program.input in program.halves
    taken: set[str] = set()
    constant_names = {name: c_identifier(name, taken, "c_") for name in program.constants}
    state_names = {window.layer: c_identifier(window.layer, taken, "state_") for window in streamed.windows} \
        if streamed else {}

    def pointer(tensor: str) -> str:
        if tensor in constant_names:
            wide = program.constants[tensor].quant.storage != "int8"
            return f"(const int8_t *)(const void *){constant_names[tensor]}" if wide else constant_names[tensor]
        buffer = program.buffer.get(tensor, tensor)
        if buffer in program.states:
            window, frame = program.states[buffer]
            return state_names[window.layer] + (f" + {frame * window.channels}" if frame else "")
        if buffer == program.input:  # token ids or int16: a kernel's int8 pointer, which it casts back
            return "(const int8_t *)(const void *)in" if wide_input else "in"
        if buffer == program.output:
            return "(int8_t *)(void *)out" if program.output in program.halves else "out"
        return f"arena + {arena.placements[buffer].offset}"

    files: dict[str, str | bytes] = {COMMON_HEADER: env.get_template(f"{COMMON_HEADER}.j2").render(version=version,
                                                                                            rounding=qgraph.rounding),
                                    WIDE_HEADER: env.get_template(f"{WIDE_HEADER}.j2").render(version=version,
                                                                                          rounding=qgraph.rounding)}
    calls: list[dict[str, Any]] = []
    headers: list[str] = []
    stage_headers: list[str] = []   # a patched stage's driver works on the arena: included after it
    idents: dict[int, str] = {}   # step index -> its function
    traced = [Traced(qgraph.input, program.storage[qgraph.input], qgraph.input_params.storage)]
    kernel_contexts = [step.kernel.context(step) for step in program.steps]
    weight_bytes = _weight_bytes(qgraph, program, kernel_contexts)
    blob = weight_blob(kernel_contexts)
    for index, (step, kernel_context) in enumerate(zip(program.steps, kernel_contexts)):
        ident = idents[index] = c_identifier(step.name, taken)
        parameters = [f"const int8_t *restrict in{k}" for k in range(len(step.inputs))]
        parameters += [f"int8_t *restrict out{k}" for k in range(len(step.outputs))]
        # a banded step is called by its stage's driver, on windows the driver knows (_stage_driver)
        arguments = [] if step.banded else [pointer(o.name) for o in [*step.inputs, *step.outputs]]
        if step.scratch_bytes:
            parameters.append("int8_t *restrict scratch")
            arguments += [] if step.banded else [pointer(scratch_name(step))]
        if step.banded:
            parameters += ["int32_t row_begin", "int32_t row_end", "int32_t in_first"]
        context: dict[str, Any] = {"version": version, "ident": ident, "name": step.name, "banded": step.banded,
                                   "signature": ", ".join(parameters), **kernel_context}
        header = f"layer_{ident[2:]}.h"
        headers.append(header)
        files[header] = env.get_template("layer.h.j2").render(
            context, kernel=step.kernel.name, config=_config_template(env, step),
            forward=f"kernels/{step.kernel.name}.forward.j2")
        if stage and stage.first <= index < stage.last:
            continue   # a patched stage's inner tensors never exist whole: no call of its own, nothing to trace
        reported = [Traced(o.name, o.storage, "float32" if o.params is None else o.params.storage)
                    for o in step.outputs if step.layer is not None and streamed is None]
        traced += reported
        call: dict[str, Any] = {
            "ident": ident, "header": header, "arguments": ", ".join(arguments), "kernel": step.kernel.name,
            "name": step.name, "fill": warmup_fill(program, step.outputs[0].name, state_names, qgraph),
            "traces": [{"tensor": t.tensor, "pointer": pointer(t.tensor), "bytes": t.bytes} for t in reported]}
        if stage and index == stage.last:
            call |= _stage_driver(env, stage, planned, [idents[i] for i in range(stage.first, stage.last + 1)],
                                  pointer, taken, files, version)
            stage_headers.append(call["header"])
        calls.append(call)

    source, target = qgraph.input_params, qgraph.output_params
    span = source.qmax - source.qmin
    model: dict[str, Any] = {
        "version": version,
        "input_size": window_graph.tensors[qgraph.input].size,
        "output_size": window_graph.tensors[qgraph.output].size,
        "arena": arena,
        "placements": list(arena.placements.values()),
        "input_scale": c_float(source.scale), "input_scale_decimal": f"{source.scale:.9g}",
        "input_zero_point": source.zero_point,
        "input_low_bound": -span - 1, "input_high_bound": span,
        "input_type": f"{source.storage}_t", "output_type": f"{target.storage}_t",
        "input_min": int(np.iinfo(source.storage).min), "input_max": int(np.iinfo(source.storage).max),
        "output_scale": c_float(target.scale), "output_scale_decimal": f"{target.scale:.9g}",
        "output_zero_point": target.zero_point,
        "constants": [{"ident": constant_names[name], "name": name, "values": qgraph.constants[name],
                       "type": f"{program.constants[name].quant.storage}_t"} for name in program.constants],
        "calls": calls,
        "headers": headers,
        "stage_headers": stage_headers,
        "input_name": qgraph.input,
        "indices": qgraph.takes_indices,
        "common_header": COMMON_HEADER,
        "blob_bytes": len(blob),
        "streaming": stream_context(streamed, program, window_graph, state_names) if streamed else None,
    }
    if blob:
        files[WEIGHTS_FILE] = blob
        files[WEIGHTS_FALLBACK] = string_literal_lines(blob) + "\n"
    files["model.h"] = env.get_template("model.h.j2").render(model)
    files["model.c"] = env.get_template("model.c.j2").render(model)
    files["main.c"] = env.get_template("main.c.j2").render(version=version)
    library_sources = ["model.c"]
    build = {"version": version, "library_sources": library_sources, "program": PROGRAM, "blob": bool(blob),
             "headers": sorted(name for name in files if name.endswith(".h"))}
    files["Makefile"] = env.get_template("Makefile.j2").render(build)
    files["CMakeLists.txt"] = env.get_template("CMakeLists.txt.j2").render(build)
    if profile.cortex_m:
        board = {"version": version, "cpu": profile.name, "board": profile.board, "stack_reserve": STACK_RESERVE}
        files[STARTUP] = env.get_template("firmware/startup.c.j2").render(board)
        files[LINKER_SCRIPT] = env.get_template("firmware/link.ld.j2").render(board)
    kernels = {step.name: step.kernel.name for step in program.steps}
    return Rendered(files, library_sources, arena, planned.report(), kernels, [] if streamed else traced,
                    weight_bytes, streamed)


def _stage_driver(env: jinja2.Environment, stage: Patch, planned: Plan, idents: list[str], pointer: Any,
                  taken: set[str], files: dict[str, str | bytes], version: str) -> dict[str, Any]:
    """The header of a patched stage's function (templates/patch.h.j2), which model_forward calls in place of
    its layers; the call's ident, header and arguments."""
    ident = c_identifier(stage.name, taken, "p_")
    table = np.array([[value for call in band for value in (call.begin, call.end, call.in_first, call.drop, call.keep)]
                      for band in stage.bands], np.int64)
    windows = [pointer(window_name(stage, number)) for number in range(len(stage.windows))]
    layers = [{"ident": layer_ident, "name": step.name, "column": 5 * number,
               "input": "in0" if number == 0 else windows[number - 1],
               "window": windows[number] if number < len(windows) else None,
               # the rows kept never overlap those they replace: memcpy, faster than memmove in newlib
               "apart": all(band[number].keep <= band[number].drop for band in stage.bands if band[number].drop),
               "scratch": pointer(scratch_name(stage.steps[-1])) if step.scratch_bytes else None}
              for number, (layer_ident, step) in enumerate(zip(idents, stage.steps))]
    header = f"patch_{ident[2:]}.h"
    files[header] = env.get_template("patch.h.j2").render(
        version=version, ident=ident, name=stage.name, layers=layers, schedule=table, bands=len(stage.bands),
        out_row_bytes=stage.rows[-1].out_row_bytes, report=stage.report(),
        layer_by_layer=planned.layer_by_layer.peak_bytes, peak=planned.arena.peak_bytes)
    first, last = stage.steps[0], stage.steps[-1]
    source = next(o.name for o in first.inputs if not o.constant)
    return {"ident": ident, "header": header, "arguments": f"{pointer(source)}, {pointer(last.outputs[0].name)}",
            "kernel": "patch"}


def stored_bytes(qgraph: QGraph, cpu: str | Profile = HOST, steps: StepBytes | None = None) -> int:
    """Bytes the artifact for `cpu` (a profile's name, or the profile) stores for the QGraph's weights and
    parameters (weights in the profile's layout, biases, requantization constants, tables): the c capability's
    `size`. `steps` remembers each step's bytes across calls (tuning prices hundreds of configs).

    What `render` counts, without rendering: tuning measures every config it costs, and rendering a
    ResNet-50's source takes half a minute where its kernels' contexts take a third of a second."""
    program = build_program(qgraph, PROFILES[cpu] if isinstance(cpu, str) else cpu)
    return _graph_constant_bytes(qgraph, program) + sum((steps or StepBytes()).bytes(step) for step in program.steps)


class StepBytes:
    """Each program step's constant bytes, by a key of everything its kernel's context reads: the kernel, the step's
    name, its layer's every field (`ContentKeys`), its operands (storage and quantization), the profile, the float
    constants it reads, the rounding, the clamp it applies and whether it is banded. A tuning run's configs share
    most steps, so each distinct step is laid out once (a ResNet-50 conv's context takes milliseconds)."""

    def __init__(self) -> None:
        self._keys = ContentKeys()
        self._bytes: dict[Hashable, int] = {}

    def bytes(self, step: Step) -> int:
        key = (step.kernel.name, step.name, None if step.layer is None else self._keys.layer(step.layer),
               tuple(step.inputs), tuple(step.outputs), step.profile, self._keys.value(step.constants),
               step.rounding, None if step.clamp is None else self._keys.layer(step.clamp), step.banded)
        if key not in self._bytes:
            self._bytes[key] = constant_bytes(step.kernel.context(step))
        return self._bytes[key]


def _graph_constant_bytes(qgraph: QGraph, program: Program) -> int:
    """Bytes of the integer graph constants the program reads (an addend, a concat piece)."""
    return sum(qgraph.constants[name].size * np.dtype(program.constants[name].quant.storage).itemsize
               for name in program.constants)


def _weight_bytes(qgraph: QGraph, program: Program, kernel_contexts: list[dict[str, Any]]) -> int:
    """Bytes of every constant array of the artifact: the integer graph constants and each kernel's arrays."""
    return _graph_constant_bytes(qgraph, program) + sum(constant_bytes(context) for context in kernel_contexts)


def _config_template(env: jinja2.Environment, step: Step) -> str | None:
    name = f"kernels/{step.kernel.config or step.kernel.name}.config.j2"
    return name if name in env.list_templates() else None
