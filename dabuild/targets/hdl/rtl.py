"""The RTL of an hdl artifact: da4ml's Verilog/VHDL project, and its simulation.

`write_rtl` writes da4ml's project (sources under src/, vendor build scripts)
into the artifact's rtl/ folder, combinational or pipelined at
`latency_cutoff`. `simulate` runs the artifact's own Verilog sources in an
event-driven simulator with a small testbench of ours: one packed input
vector per sample from a hex file, the top module `model_wrapper` (da4ml's
uniform-width interface: element j at bits [j*w, (j+1)*w), lsb 2**-f of the
widest fractional part, sign-extended), clocked through every stage when
pipelined, and one packed output vector per sample back.

Simulators, in order of preference: verilator (`--binary`, verilator >= 5) and
Icarus Verilog. The sources are simulated from a scratch copy with one change,
to lint pragmas only: da4ml silences `WIDTHTRUNC`, a warning code verilator
split out of `WIDTH` in 5.008; older verilators (Debian 12 ships 5.006) reject
the unknown code, so the copy names `WIDTH`, which covers it in every version. da4ml's own verilator emulator (`RTLModel.compile`) is not
used: its makefile expects the layout of verilator releases newer than
Debian 12's 5.006 (VERILATOR_ROOT from the environment, libV*.a archives).

Verilator's C++ is compiled unoptimised (`-O0`, `-j` across the cores): a
check simulates a few hundred samples, so the compile is the whole cost, and
verilator's default `-Os` spends most of it on the huge straight-line
functions a netlist becomes. On recipes/jet-mlp-hgq's 420 KB of Verilog the
compile took 565 s at -Os and 47 s at -O0; the 200-sample run, 0.2 s.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
from da4ml.codegen import RTLModel
from da4ml.types import CombLogic, Pipeline, minimal_kif

from dabuild.errors import BuildError
from dabuild.targets.hdl.program import Manifest, to_integer
from dabuild.targets.hdl.simulators import simulator

RTL_DIR = "rtl"
PROJECT = "model"
TOP = f"{PROJECT}_wrapper"


def write_rtl(solution: CombLogic | Pipeline, path: Path, language: str, clock_period: float, register_layers: int,
              part_name: str) -> None:
    """da4ml's RTL project of `solution` (pipelined when it is a Pipeline) into `path`."""
    RTLModel(solution, PROJECT, path, flavor=language, print_latency=False, part_name=part_name,
             clock_period=clock_period, register_layers=register_layers).write()
    for table in (Path(path) / "src" / "memfiles").glob("*"):
        _end_with_newline(table)


def _end_with_newline(table: Path) -> None:
    """da4ml writes lookup-table memory files without a final newline, and verilator's $readmemh then drops
    the last entry (the table's all-ones address); every reader accepts the file with one."""
    text = table.read_text()
    if text and not text.endswith("\n"):
        table.write_text(text + "\n")


def simulator_missing(language: str) -> str | None:
    """Why the RTL of `language` cannot be simulated here, or None when it can."""
    if language != "verilog":
        return "only Verilog RTL is simulated (export with language: verilog)"
    if simulator() is None:
        return "neither verilator nor iverilog is installed (Debian/Ubuntu: apt-get install verilator iverilog)"
    return None


def _widths(qints: list) -> tuple[int, int, int]:
    """(element bits, fractional bits, signed) of da4ml's uniform-width wrapper for these intervals."""
    ks, integers, fractions = zip(*map(minimal_kif, qints))
    return max(integers) + max(ks) + max(fractions), max(fractions), int(max(ks))


def _testbench(input_bits: int, output_bits: int, samples: int, cycles: int) -> str:
    clock = "    reg clk = 0;\n    always #5 clk = ~clk;\n" if cycles else ""
    port = ".clk(clk), " if cycles else ""
    settle = f"repeat ({cycles}) @(posedge clk); #1;" if cycles else "#1;"
    return f"""`timescale 1ns/1ps
module testbench;
{clock}    reg [{input_bits - 1}:0] inputs [0:{samples - 1}];
    reg [{input_bits - 1}:0] model_inp;
    wire [{output_bits - 1}:0] model_out;
    integer sample, out_file;
    {TOP} dut ({port}.model_inp(model_inp), .model_out(model_out));
    initial begin
        $readmemh("inputs.hex", inputs);
        out_file = $fopen("outputs.hex", "w");
        for (sample = 0; sample < {samples}; sample = sample + 1) begin
            model_inp = inputs[sample];
            {settle}
            $fwrite(out_file, "%h\\n", model_out);
        end
        $fclose(out_file);
        $finish;
    end
endmodule
"""


def _compile_and_run(tool: str, sources: list[Path], work: Path) -> None:
    if tool == "verilator":
        commands = [["verilator", "--binary", "--timing", "-Wno-fatal", "-Wno-lint", "-Wno-style", "--top-module",
                     "testbench", "-Mdir", "obj_dir", "-o", "testbench", "-j", "0",
                     "-MAKEFLAGS", "OPT_FAST=-O0 OPT_SLOW=-O0 OPT_GLOBAL=-O0", *map(str, sources)],
                    ["./obj_dir/testbench"]]
    else:
        commands = [["iverilog", "-g2012", "-s", "testbench", "-o", "testbench.vvp", *map(str, sources)],
                    ["vvp", "-n", "testbench.vvp"]]
    for command in commands:
        result = subprocess.run(command, check=False, cwd=work, capture_output=True, text=True)
        if result.returncode != 0:
            raise BuildError(f"simulating the RTL with {tool} failed: `{' '.join(command[:2])} ...` exited "
                             f"{result.returncode}:\n{(result.stderr or result.stdout).strip()[-2000:]}")


def simulate(artifact_dir: Path, solution: CombLogic | Pipeline, work_dir: Path, inputs: np.ndarray,
             manifest: Manifest) -> tuple[str, np.ndarray]:
    """The simulator used and the integer outputs of the artifact's Verilog on integer `inputs`."""
    tool = simulator()
    if tool is None:
        raise BuildError(simulator_missing("verilog") or "no simulator")
    source_dir = Path(artifact_dir) / RTL_DIR / "src"
    work = Path(work_dir) / "simulation"
    work.mkdir(parents=True, exist_ok=True)
    for table in (source_dir / "memfiles").glob("*"):  # lookup-table contents, read relative to the run folder
        shutil.copy(table, work)
    in_width, in_fraction, _ = _widths(solution.inp_qint)
    out_width, out_fraction, out_signed = _widths(solution.out_qint)
    n_in, n_out = solution.shape
    real = np.asarray(inputs).reshape(len(inputs), -1).astype(np.float64) * 2.0 ** -manifest.input_fractional_bits
    codes = np.round(real * 2.0 ** in_fraction).astype(np.int64) & ((1 << in_width) - 1)
    lines = []
    for row in codes:
        packed = 0
        for position, code in enumerate(row.tolist()):
            packed |= code << (position * in_width)
        lines.append(f"{packed:x}")
    (work / "inputs.hex").write_text("\n".join(lines) + "\n")
    # A pipelined design holds each input one clock edge longer than its latency: the output is then settled.
    cycles = manifest.clock_cycles + 1 if manifest.stages else 0
    (work / "testbench.v").write_text(_testbench(in_width * n_in, out_width * n_out, len(inputs), cycles))
    sources = [work / "testbench.v"]
    for source in [*sorted(source_dir.glob("*.v")), *sorted((source_dir / "static").glob("*.v"))]:
        copy = work / "src" / source.relative_to(source_dir)
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(source.read_text().replace("lint_off WIDTHTRUNC", "lint_off WIDTH")
                        .replace("lint_on WIDTHTRUNC", "lint_on WIDTH"))
        sources.append(copy)
    _compile_and_run(tool, sources, work)
    packed_outputs = [int(line, 16) for line in (work / "outputs.hex").read_text().split()]
    if len(packed_outputs) != len(inputs):
        raise BuildError(f"the {tool} simulation of {source_dir} wrote {len(packed_outputs)} outputs for "
                         f"{len(inputs)} inputs")
    mask, sign = (1 << out_width) - 1, 1 << (out_width - 1)
    values = np.array([[((packed >> (j * out_width)) & mask) for j in range(n_out)] for packed in packed_outputs],
                      dtype=np.int64)
    if out_signed:
        values = np.where(values & sign, values - (1 << out_width), values)
    return tool, to_integer(manifest, values * 2.0 ** -out_fraction, f"the {tool} simulation of {source_dir}")
