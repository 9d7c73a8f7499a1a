"""The hdl target: fixed-point logic through da4ml, as Verilog (or VHDL), proven bit for bit.

Export lowers nothing itself: the QGraph (quantized with power-of-two scales,
capability `da4ml`) is traced by da4ml through dabuild's DAIS tracer plugin,
and da4ml turns every constant matrix into an adder graph. The artifact holds
the DAIS program (model.comb.json, model.dais), its RTL project (rtl/, da4ml's
layout: src/, sim/, vendor build scripts) and hdl.json (interface, cost and
latency estimates, options).

`check:hdl` compares with dabuild's integer reference at `exact`: `run` executes
the DAIS program in da4ml's bit-exact interpreter and, when verilator is
installed (and `simulate` allows), also simulates the RTL and requires the
two to agree bit for bit before returning.

da4ml is an extra (`pip install dabuild[hdl]`), imported only when this target
exports or runs.
"""

from __future__ import annotations

import importlib
import shlex
from pathlib import Path
from types import ModuleType
from typing import ClassVar, Literal

import numpy as np
from pydantic import Field

from dabuild import notices
from dabuild.errors import BuildError, CheckError
from dabuild.installed import installed_version
from dabuild.qir.qgraph import QGraph
from dabuild.targets.base import Target, held, refuse_float_layers
from dabuild.targets.hdl.simulators import simulator, simulator_programs, simulator_version


def _import(module: str) -> ModuleType:
    """Import a module of this package that needs da4ml; BuildError saying how to get it."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        if error.name is not None and error.name.split(".")[0] == "da4ml":
            raise BuildError("the hdl target needs the Python package 'da4ml', which is not installed; install it "
                             "with `pip install dabuild[hdl]`") from error
        raise


class HdlTarget(Target):
    kind: ClassVar[str] = "hdl"
    capability: ClassVar[str] = "da4ml"
    default_tolerance = "exact"
    packages: ClassVar[tuple[str, ...]] = ("da4ml",)

    class Options(Target.Options):
        language: Literal["verilog", "vhdl"] = Field(default="verilog", description="RTL language of the sources.")
        latency_cutoff: float = Field(
            default=-1, description="Pipelining: the largest combinational delay per stage, in da4ml's adder-delay "
                                    "units; <= 0 leaves the logic combinational.")
        register_layers: int = Field(default=1, ge=1, description="Registers between pipeline stages.")
        adder_size: int = Field(default=1, description="da4ml HWConfig: the adder's elementary size, for cost "
                                                       "and latency estimates.")
        carry_size: int = Field(default=-1, description="da4ml HWConfig: the carry chain size (-1: unbounded).")
        clock_period: float = Field(default=5.0, gt=0, description="Clock period (ns) in the timing constraints.")
        part_name: str = Field(default="xcvu13p-flga2577-2-e", description="FPGA part in the vendor build scripts.")
        simulate: Literal["auto", "always", "never"] = Field(
            default="auto", description="Simulate the RTL with verilator in check: when installed (auto), "
                                        "required (always), or not.")

    options: Options

    @classmethod
    def layer_types(cls) -> frozenset[str]:
        return held(_import("dabuild.targets.hdl.symbolic").CONVERTERS)

    def runtime_version(self) -> dict[str, str]:
        versions = {"da4ml": installed_version("da4ml")}
        tool = self._simulator()
        if tool is not None:
            versions[tool] = simulator_version(tool)
        return versions

    def programs(self) -> list[Path]:
        tool = self._simulator()
        return simulator_programs(tool) if tool else []

    def not_run(self) -> list[str]:
        if self.options.simulate == "never":
            return ["RTL simulation (simulate: never): only da4ml's DAIS interpreter ran the logic"]
        missing = _import("dabuild.targets.hdl.rtl").simulator_missing(self.options.language)
        if missing is not None and self.options.simulate == "auto":
            return [f"RTL simulation (simulate: auto): {missing}; only da4ml's DAIS interpreter ran the logic"]
        return []

    def _simulator(self) -> str | None:
        return None if self.options.simulate == "never" else simulator()

    def _hwconf(self):
        trace = _import("da4ml.trace")
        return trace.HWConfig(self.options.adder_size, self.options.carry_size, self.options.latency_cutoff)


    def export(self, qgraph: QGraph, out_dir: Path) -> None:
        refuse_float_layers(qgraph, self.capability_spec)
        program = _import("dabuild.targets.hdl.program")
        rtl = _import("dabuild.targets.hdl.rtl")
        comb = program.trace(qgraph, self._hwconf())
        solution = program.pipelined(comb, self.options.latency_cutoff)
        out_dir = Path(out_dir)
        program.write_program(comb, out_dir)
        rtl.write_rtl(solution, out_dir / rtl.RTL_DIR, self.options.language, self.options.clock_period,
                      self.options.register_layers, self.options.part_name)
        program.manifest_of(qgraph, comb, solution, self.options.register_layers).save(out_dir)

    def run(self, artifact_dir: Path, inputs: np.ndarray, work_dir: Path) -> np.ndarray:
        program = _import("dabuild.targets.hdl.program")
        rtl = _import("dabuild.targets.hdl.rtl")
        outputs = program.run_dais(Path(artifact_dir), inputs)
        if self.options.simulate == "never":
            return outputs
        missing = rtl.simulator_missing(self.options.language)
        if missing is not None:
            if self.options.simulate == "always":
                raise BuildError(f"the hdl target's options ask to simulate the RTL, but {missing}")
            return outputs
        manifest = program.Manifest.load(Path(artifact_dir))
        solution = program.pipelined(program.load_program(Path(artifact_dir)), self.options.latency_cutoff)
        tool, simulated = rtl.simulate(Path(artifact_dir), solution, Path(work_dir), inputs, manifest)
        differ = np.flatnonzero(np.any(simulated.reshape(len(inputs), -1) != outputs.reshape(len(inputs), -1), axis=1))
        if not differ.size:
            return outputs
        evaluated = program.evaluate(program.load_program(Path(artifact_dir)), manifest, inputs[differ])
        if np.array_equal(evaluated.reshape(simulated[differ].shape), simulated[differ]):
            notices.warn(f"check hdl: da4ml's DAIS interpreter miscomputed {differ.size} of {len(inputs)} samples of "
                         f"{artifact_dir}, where the {tool} simulation and da4ml's Python evaluation of the program "
                         "agree: the check takes the simulated outputs")
            return simulated
        sample = int(differ[0])
        raise CheckError(f"check hdl: the {tool} simulation of {Path(artifact_dir) / rtl.RTL_DIR} disagrees with "
                         f"da4ml's evaluation of the program, first at sample {sample} (RTL "
                         f"{simulated[sample].tolist()}, da4ml {outputs[sample].tolist()})")

    def rerun_script(self, artifact_dir: Path, inputs_file: str, outputs_file: str) -> str:
        command = ["-m", "dabuild.targets.hdl.runner", Path(artifact_dir).name, inputs_file, outputs_file]
        return '"${PYTHON:-python3}" ' + shlex.join(command) + "\n"
