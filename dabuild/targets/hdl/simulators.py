"""Which Verilog simulator this machine has; standard library only, so cache keys need no da4ml."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

# Each simulator with the programs it runs and how it reports its version.
PROGRAMS = {"verilator": ("verilator", "c++", "make"), "iverilog": ("iverilog", "vvp")}
VERSION_FLAG = {"verilator": "--version", "iverilog": "-V"}


def simulator() -> str | None:
    """The Verilog simulator to use: 'verilator', 'iverilog', or None when neither is installed."""
    for tool, programs in PROGRAMS.items():
        if all(shutil.which(program) for program in programs):
            return tool
    return None


def simulator_version(tool: str) -> str:
    """The first line the simulator prints about its version."""
    result = subprocess.run([tool, VERSION_FLAG[tool]], check=False, capture_output=True, text=True)
    lines = (result.stdout or result.stderr).strip().splitlines()
    return lines[0] if lines else "unknown"


def simulator_programs(tool: str) -> list[Path]:
    """The files of the programs a simulation with `tool` runs."""
    return [Path(path) for program in PROGRAMS[tool] if (path := shutil.which(program))]
