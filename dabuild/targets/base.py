"""The target plugin interface: what every backend (C, ONNX, HDL, ...) implements.

A target class is found through the `dabuild.targets` entry point group by its
`kind`. Its `Options` model validates the recipe's `options:` block, so a typo
there is reported against the recipe, not deep inside a build.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict

from dabuild.quant.qgraph import QGraph


class Target:
    kind: ClassVar[str]
    capability: ClassVar[str]          # name of the capability YAML used when the recipe names none
    default_tolerance: ClassVar[str]   # a level of dabuild.targets.tolerance.LEVELS
    packages: ClassVar[tuple[str, ...]] = ()   # Python packages whose versions enter the export/check keys

    class Options(BaseModel):
        model_config = ConfigDict(extra="forbid")

    def __init__(self, options: "Target.Options | None" = None):
        self.options = options if options is not None else self.Options()

    def runtime_version(self) -> dict[str, str]:
        """Versions of the external tools this target runs; part of the export/check cache keys."""
        return {}

    # Hooks around the pipeline; most targets need none of them.
    def pre_trace(self, model_spec: Any) -> None:
        """Called before tracing (e.g. to reject a framework the target cannot take)."""

    def post_trace(self, graph: Any) -> None:
        """Called with the traced graph (e.g. to reject ops early)."""

    def post_export(self, out_dir: Path) -> None:
        """Called after export with the finished artifact directory."""

    def export(self, qgraph: QGraph, out_dir: Path) -> None:
        """Write the artifact for `qgraph` into `out_dir`."""
        raise NotImplementedError(f"target {self.kind!r} does not implement export")

    def run(self, artifact_dir: Path, inputs: np.ndarray, work_dir: Path) -> np.ndarray:
        """Execute the artifact in its real runtime on quantized `inputs`; return its outputs."""
        raise NotImplementedError(f"target {self.kind!r} does not implement run")

    def rerun_script(self, artifact_dir: Path, inputs_file: str, outputs_file: str) -> str:
        """Shell lines that rebuild `artifact_dir` and run it on a raw int8 inputs file (for debug bundles).

        The script runs in the parent of `artifact_dir`, so it names the artifact by its folder name.
        """
        raise NotImplementedError(f"target {self.kind!r} does not describe how to rerun its artifact")
