"""TensorFlow Lite Micro with CMSIS-NN kernels running a .tflite file on a Cortex-M core in qemu: the peer, measured.

bench/tiny.py and bench/tflite.py (and tests/targets/tflite/test_tflm_cmsis_nn.py) run the very .tflite file
dabuild's tflite target writes, or a committed one, through TFLM built here from the user's checkouts (nothing
of them is copied into dabuild): its instructions per inference (qemu's exec log between two dabuild_mark
calls, as dabuild's own images are counted: dabuild.targets.c.firmware), its outputs, and the arena it used
(MicroInterpreter::arena_used_bytes after the last invoke).

The library is what TFLM's Makefile builds with OPTIMIZED_KERNEL_DIR=cmsis_nn and BUILD_TYPE=release
(-DNDEBUG -DTF_LITE_STRIP_ERROR_STRINGS), compiled directly with the profile's arm-none-eabi-g++/gcc and its
flags (the ones dabuild's image of the same core gets), all at -O2 (TFLM's Makefile builds the core at -Os,
kernels at -O2): tensorflow/lite/micro/*.cc (and arena_allocator, memory_planner, tflite_bridge), the shared
TFLite sources, the kernels sources.inc lists with each one kernels/cmsis_nn/ has replaced by it (conv,
depthwise conv, fully connected, add, mul, pooling, softmax, pad, transpose, ...), and CMSIS-NN's integer
sources, default double rounding (no CMSIS_NN_USE_SINGLE_ROUNDING): TFLM's own. It is cached per core under
the cache folder (default ~/.cache/dabuild-tflm-peer, or $DABUILD_TFLM_CACHE), keyed by the flags and the
checkouts' paths; delete the folder after changing a checkout. A driver this module writes (a C++ main)
holds the file (.incbin), registers exactly the builtin operators the file uses in a MicroMutableOpResolver,
and, per sample of inputs.bin, reads the input tensor's bytes, marks, invokes, marks and writes the output
tensor's bytes (semihosting), linked with dabuild's firmware/startup.c and link.ld of a c artifact exported
for the same profile (--gc-sections keeps the kernels the model uses).

The checkouts, in one folder (`--tflm DIR`, $DABUILD_TFLM_PEERS for the test), at the commits TFLM pins
(tensorflow/lite/micro/tools/make/third_party_downloads.inc, ext_libs/cmsis*_download.sh,
flatbuffers_download.sh):

    git clone https://github.com/tensorflow/tflite-micro DIR/tflite-micro
    git clone https://github.com/ARM-software/CMSIS-NN DIR/CMSIS-NN    # checkout 4ab83cc3cc98fb85ed6dafb55e8ca02f1628dcae
    git clone https://github.com/ARM-software/CMSIS_6 DIR/CMSIS_6      # checkout 5782d6f8057906d360f4b95ec08a2354afe5c9b9
    git clone https://github.com/google/flatbuffers DIR/flatbuffers    # checkout v25.9.23 (TFLM's schema asserts it)
    git clone https://github.com/google/gemmlowp DIR/gemmlowp          # checkout 719139ce755a0f31cbf1c37f7f98adcc7fc9f425
    git clone https://github.com/google/ruy DIR/ruy                    # checkout d37128311b445e758136b8602d1bbd2a755e115d

(the commits measured here; TFLM's Makefile would download the same, which needs the network).
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dabuild.errors import BuildError
from dabuild.qir.qgraph import QGraph
from dabuild.targets.c import firmware
from dabuild.targets.c.profiles import Profile
from dabuild.targets.tflite.runtime import file_inputs, quantized_outputs
from dabuild.trace.tflite_frontend import operator_names
from dabuild.trace.tflite_frontend.model_file import enum_names, read_model, schema

# folder name -> a path inside it that says it is that checkout
CHECKOUTS = {"tflite-micro": "tensorflow/lite/micro/micro_interpreter.h", "CMSIS-NN": "Include/arm_nnfunctions.h",
             "CMSIS_6": "CMSIS/Core/Include/cmsis_compiler.h", "flatbuffers": "include/flatbuffers/flatbuffers.h",
             "gemmlowp": "fixedpoint/fixedpoint.h", "ruy": "ruy/profiler/instrumentation.h"}
DEFINES = ("-DTF_LITE_STATIC_MEMORY", "-DTF_LITE_DISABLE_X86_NEON", "-DCMSIS_NN", "-DKERNELS_OPTIMIZED_FOR_SPEED",
           "-DARM_NN_ENABLE_F16=0", "-DARM_NN_ENABLE_F32=0", "-DNDEBUG", "-DTF_LITE_STRIP_ERROR_STRINGS",
           "-DFLATBUFFERS_LOCALE_INDEPENDENT=0")
FLAGS = ("-O2", *firmware.SECTION_FLAGS, "-fno-unwind-tables", "-fno-asynchronous-unwind-tables")
MODEL_SECTION = ".rodata.dabuild_model"  # the flatbuffer's section in the image
LIBRARY = "libtflm.a"
CXX_FLAGS = ("-std=c++17", "-fno-rtti", "-fno-exceptions", "-fno-threadsafe-statics")
ARENA_LIMIT = 1 << 20           # the most arena the driver offers; what TFLM used is measured
RAM_KEPT = 96 << 10             # RAM left beside the arena for TFLM's statics, newlib's heap and the stack
ARENA_FILE = "arena.txt"
DRIVER_EXITS = {4: "the op resolver refused an operator", 5: "AllocateTensors failed (an operator's Prepare refused "
                "the file, or the arena is too small)", 6: "Invoke failed"}   # the driver's exit codes
JOBS = 2


class PeerMissing(Exception):
    """The peer checkouts are not all there (the message names what is missing and where)."""


@dataclass(frozen=True)
class Checkouts:
    folder: Path

    def __post_init__(self) -> None:
        missing = [f"{name}/ (no {marker})" for name, marker in CHECKOUTS.items()
                   if not (self.folder / name / marker).is_file()]
        if missing:
            raise PeerMissing(f"{self.folder}: missing the checkouts {', '.join(missing)} "
                              "(bench/tflm_peer.py's docstring says how to get them)")

    def __getitem__(self, name: str) -> Path:
        return self.folder / name

    @property
    def includes(self) -> list[str]:
        return [f"-I{path}" for path in (self["tflite-micro"], self["flatbuffers"] / "include", self["gemmlowp"],
                                         self["ruy"], self["CMSIS_6"], self["CMSIS_6"] / "CMSIS/Core/Include",
                                         self["CMSIS-NN"], self["CMSIS-NN"] / "Include")]


def default_cache() -> Path:
    return Path(os.environ.get("DABUILD_TFLM_CACHE", Path.home() / ".cache" / "dabuild-tflm-peer"))


def _listed(sources_inc: str, variable: str) -> list[str]:
    """The paths a `VARIABLE := \\` block of TFLM's sources.inc lists."""
    block = sources_inc.split(f"{variable} := \\\n", 1)[1].split("\n\n", 1)[0]
    return re.findall(r"\$\(TENSORFLOW_ROOT\)(\S+)", block)


def _kernels(checkouts: Checkouts) -> list[Path]:
    """The kernels sources.inc lists, each one kernels/cmsis_nn/ has replaced by it."""
    micro = checkouts["tflite-micro"] / "tensorflow/lite/micro"
    kernels = []
    for name in _listed((micro / "tools/make/sources.inc").read_text(), "MICROLITE_CC_KERNEL_SRCS"):
        special = micro / "kernels/cmsis_nn" / Path(name).name
        kernels.append(special if special.is_file() else checkouts["tflite-micro"] / name)
    return kernels


def base_sources(checkouts: Checkouts) -> list[Path]:
    """What TFLM's Makefile compiles into libtensorflow-microlite.a besides the kernels, and CMSIS-NN's integer
    sources."""
    root = checkouts["tflite-micro"]
    micro = root / "tensorflow/lite/micro"
    core = [path for folder in ("", "arena_allocator", "memory_planner", "tflite_bridge")
            for path in sorted((micro / folder).glob("*.cc")) if not path.name.endswith("_test.cc")]
    shared = [path for path in sorted((root / "tensorflow").rglob("*.c*"))
              if path.suffix in (".c", ".cc") and not path.name.endswith("_test.cc") and path.name != "array.cc"
              and path.relative_to(root / "tensorflow").parts[:2] not in (("lite", "micro"), ("lite", "experimental"))]
    cmsis_nn = [path for path in sorted((checkouts["CMSIS-NN"] / "Source").rglob("*.c"))
                if not path.name.endswith(("_f16.c", "_f32.c")) and path.name != "arm_nntables_flt.c"]
    return core + shared + cmsis_nn


def kernel_sources(checkouts: Checkouts, registers: list[str]) -> list[Path]:
    """The kernels that define Register_<op> for `registers`, with their <kernel>_common.cc, and the kernels'
    shared utilities: what a model of those operators links (the image falls back to every kernel if not)."""
    kernels = _kernels(checkouts)
    chosen = [path for path in kernels if path.stem in ("kernel_util", "micro_tensor_utils")]
    for path in kernels:
        text = path.read_text(errors="replace")
        if any(re.search(rf"TFLMRegistration\s+Register_{name}\s*\(\s*\)\s*{{", text) for name in registers):
            chosen += [path, *(other for other in kernels if other.stem == f"{path.stem}_common")]
    return list(dict.fromkeys(chosen))


def _compile(profile: Profile, checkouts: Checkouts, source: Path, obj: Path) -> None:
    cxx = source.suffix == ".cc"
    compiler = profile.compiler.replace("gcc", "g++") if cxx else profile.compiler
    partial = obj.with_suffix(".partial")
    line = [compiler, *(CXX_FLAGS if cxx else ("-std=c11",)), *profile.flags, *FLAGS, *DEFINES,
            *checkouts.includes, "-c", str(source), "-o", str(partial)]
    result = subprocess.run(line, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f"compiling TFLM's {source} for {profile.name} failed:\n{result.stderr[-3000:]}")
    partial.rename(obj)


def objects(profile: Profile, checkouts: Checkouts, files: list[Path], cache: Path) -> list[Path]:
    """The object of each of `files` for `profile`, compiled once (cached per source, flags and checkouts)."""
    firmware.require(profile.compiler, firmware.ARM_PACKAGES)
    key = hashlib.sha256(repr((profile.flags, FLAGS, DEFINES, CXX_FLAGS,
                               str(checkouts.folder.resolve()))).encode()).hexdigest()[:16]
    folder = cache / f"{profile.name}-{key}"
    folder.mkdir(parents=True, exist_ok=True)
    built = [folder / (str(path.relative_to(checkouts.folder)).replace("/", "__") + ".o") for path in files]
    missing = [(path, obj) for path, obj in zip(files, built) if not obj.is_file()]
    with ThreadPoolExecutor(JOBS) as pool:
        list(pool.map(lambda pair: _compile(profile, checkouts, *pair), missing))
    return built


def resolver_calls(model: Path, checkouts: Checkouts) -> dict[str, str]:
    """Builtin operator -> MicroMutableOpResolver's Add<Op>() for each builtin the file uses (its header maps them)."""
    header = (checkouts["tflite-micro"] / "tensorflow/lite/micro/micro_mutable_op_resolver.h").read_text()
    methods = {register: method for method, register in
               re.findall(r"TfLiteStatus (Add\w+)\(\s*const TFLMRegistration& registration\s*=\s*"
                          r"(?:tflite::)?Register_(\w+)\(\)", header)}
    used = sorted(set(operator_names(read_model(model))))
    missing = [name for name in used if name not in methods]
    if missing:
        raise SystemExit(f"{model}: TFLM's MicroMutableOpResolver registers no {', '.join(missing)}")
    return {name: f"{methods[name]}()" for name in used}


def driver(calls: list[str], arena_bytes: int) -> str:
    """The C++ main: every sample of inputs.bin through MicroInterpreter::Invoke, between two dabuild_mark calls."""
    adds = "\n".join(f"    if (resolver.{call} != kTfLiteOk) return 4;" for call in calls)
    return f"""/* One .tflite through TensorFlow Lite Micro (written by dabuild's bench/tflm_peer.py). */
#include <stdio.h>
#include "tensorflow/lite/micro/micro_interpreter.h"
#include "tensorflow/lite/micro/micro_mutable_op_resolver.h"

extern "C" void dabuild_mark(void);
extern "C" void __libc_init_array(void);
extern "C" const unsigned char dabuild_model[];
alignas(16) static uint8_t arena[{arena_bytes}];

int main(int argc, char **argv)
{{
    __libc_init_array();   /* dabuild's startup runs no constructors */
    if (argc < 3) return 2;
    tflite::MicroMutableOpResolver<{len(calls)}> resolver;   /* locals: no destructor registered at exit */
{adds}
    tflite::MicroInterpreter interpreter(tflite::GetModel(dabuild_model), resolver, arena, sizeof arena);
    if (interpreter.AllocateTensors() != kTfLiteOk) return 5;
    TfLiteTensor *input = interpreter.input(0), *output = interpreter.output(0);
    FILE *inputs = fopen(argv[1], "rb"), *outputs = fopen(argv[2], "wb");
    if (inputs == NULL || outputs == NULL) return 1;
    while (fread(input->data.raw, 1, input->bytes, inputs) == input->bytes) {{
        dabuild_mark();
        TfLiteStatus status = interpreter.Invoke();
        dabuild_mark();
        if (status != kTfLiteOk) return 6;
        if (fwrite(output->data.raw, 1, output->bytes, outputs) != output->bytes) return 1;
    }}
    fclose(inputs);
    FILE *arena_file = fopen("{ARENA_FILE}", "w");
    if (arena_file == NULL || fclose(outputs) != 0) return 1;
    fprintf(arena_file, "%u\\n", (unsigned)interpreter.arena_used_bytes());
    return fclose(arena_file) == 0 ? 0 : 1;
}}
"""


def image(model: Path, profile: Profile, checkouts: Checkouts, artifact: Path, work: Path, cache: Path) -> Path:
    """The linked image.elf of `model`'s driver in `work`; `artifact` is a dabuild c export for `profile` (its
    firmware/ startup and linker script boot the image)."""
    assert profile.board is not None
    calls = resolver_calls(model, checkouts)
    work.mkdir(parents=True, exist_ok=True)
    arena = min(ARENA_LIMIT, profile.board.ram_bytes - RAM_KEPT)
    (work / "tflm_driver.cc").write_text(driver(list(calls.values()), arena))
    (work / "model_data.S").write_text(f'.section {MODEL_SECTION}, "a"\n.balign 16\n.global dabuild_model\n'
                                       f'dabuild_model:\n.incbin "{model.resolve()}"\n')
    startup = work / "startup.o"
    subprocess.run([profile.compiler, "-std=c99", *profile.flags, "-O2", "-c", str(artifact / firmware.STARTUP),
                    "-o", str(startup)], check=True)
    base = objects(profile, checkouts, base_sources(checkouts), cache)
    for kernels in (kernel_sources(checkouts, list(calls)), _kernels(checkouts)):
        library = work / LIBRARY
        library.unlink(missing_ok=True)
        subprocess.run([profile.compiler.replace("gcc", "ar"), "rcs", str(library),
                        *map(str, base + objects(profile, checkouts, kernels, cache))], check=True)
        elf = work / "image.elf"
        result = subprocess.run([profile.compiler.replace("gcc", "g++"), *CXX_FLAGS, *profile.flags, *FLAGS,
                                 *DEFINES, *checkouts.includes, *firmware.LINK_FLAGS, f"-Wl,-Map={work}/image.map",
                                 "-T", str(artifact / firmware.LINKER_SCRIPT), "-o", str(elf),
                                 str(work / "tflm_driver.cc"), str(work / "model_data.S"), str(startup), str(library),
                                 "-lm"], capture_output=True, text=True, check=False)
        if result.returncode == 0:
            return elf
        if "undefined reference" not in result.stderr:
            break   # not for want of a kernel: every kernel would not help
    raise SystemExit(f"linking TFLM's image of {model} for {profile.name} failed:\n{result.stderr[-3000:]}")


@dataclass(frozen=True)
class Measured:
    outputs: np.ndarray        # the output tensor per sample as quantized integers (int64), batch first
    arena_bytes: int           # MicroInterpreter::arena_used_bytes() after the last invoke
    instructions: int | None   # one inference (the first sample), qemu's exec log; None: not counted
    flash_bytes: int           # the model flatbuffer and the TFLM library's linked text, rodata and data


def _io(model: Path) -> tuple[tuple[np.dtype, tuple[int, ...]], tuple[np.dtype, tuple[int, ...]]]:
    """(dtype, shape) of the file's input and output tensors."""
    file = read_model(model)
    types = enum_names(schema().TensorType)
    graph = file.subgraphs[0]
    kinds = []
    for index in (graph.inputs[0], graph.outputs[0]):
        tensor = graph.tensors[index]
        kinds.append((np.dtype(types[int(tensor.type)].lower()), tuple(int(n) for n in tensor.shape)))
    return kinds[0], kinds[1]


def measure(model: Path, qgraph: QGraph, samples: np.ndarray, profile: Profile, checkouts: Checkouts,
            artifact: Path, work: Path, count: bool = True, cache: Path | None = None,
            timeout: float = 900.0) -> Measured:
    """TFLM+CMSIS-NN on `profile`'s qemu board: the quantized `samples` (batch first, as `qgraph` of the file
    takes them) through the file, every sample run and, with `count`, the first one counted. A file with float
    input and output (TensorFlow's converter's default) gets each sample as the real values it stands for, which
    its QUANTIZE turns back into the same integers, and its outputs quantized back by `qgraph`'s output params."""
    (given, shape_in), (taken, shape_out) = _io(model)
    manifest = {"float_io": given == np.float32,
                "input_params": [qgraph.input_params.scale, qgraph.input_params.zero_point],
                "output_params": [qgraph.output_params.scale, qgraph.output_params.zero_point]}
    feed = file_inputs(manifest, np.asarray(samples)).reshape(len(samples), *shape_in[1:])
    elf = image(model, profile, checkouts, artifact, work, cache or default_cache())
    run, counted = work / "run", work / "count"
    for folder, part in ((run, feed), (counted, feed[:1])):
        folder.mkdir(exist_ok=True)
        np.ascontiguousarray(part, dtype=given).tofile(folder / "inputs.bin")
    try:
        firmware.run_image(profile, elf, run, timeout)
    except BuildError as error:
        why = next((words for code, words in DRIVER_EXITS.items() if f"with exit {code}:" in str(error)), None)
        raise SystemExit(f"{model}: TFLM on {profile.name}: {why}" if why else str(error)) from None
    outputs = np.fromfile(run / "outputs.bin", dtype=taken).reshape(len(samples), *shape_out[1:])
    instructions = firmware.count_instructions(profile, elf, counted, timeout)[0] if count else None
    return Measured(quantized_outputs(manifest, outputs), int((run / ARENA_FILE).read_text()), instructions,
                    flash_bytes(work / "image.map"))


def flash_bytes(map_file: Path) -> int:
    """What TFLM costs in flash for the model (as dabuild's c target counts its model object): the flatbuffer and
    the library's objects the linker kept (interpreter, kernels, CMSIS-NN); not the driver, startup or C library,
    which a firmware has either way."""
    sizes = firmware.linked_sizes(map_file, lambda section, source: section == MODEL_SECTION
                                  or Path(source.split("(", 1)[0]).name == LIBRARY)
    return sizes["text"] + sizes["rodata"] + sizes["data"]
