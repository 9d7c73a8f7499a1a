"""The bundled example builds every target it names, each proven in its runtime."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import DIGITS

from dabuild.cli import main


def test_bundled_digits_example_builds_c_onnx_and_nnef(tmp_path: Path, cache_dir: Path) -> None:
    pytest.importorskip("onnxruntime", reason="the example's ort target needs dabuild[onnx]")
    pytest.importorskip("tract", reason="the example's tract target needs dabuild[tract]")
    assert main(["build", str(DIGITS), "--build-dir", str(tmp_path / "build"), "-q", "-j", "2"]) == 0
    summary = json.loads((tmp_path / "build" / "digits-mlp" / "build.json").read_text())
    checks = summary["checks"]
    assert {name: (report["ok"], report["tolerance"]) for name, report in checks.items()} == {
        "mcu": (True, "exact"),
        "ort": (True, "approximate"),
        "tract": (True, "approximate"),
        "cortex-m4": (True, "exact"),
        "cortex-m55": (True, "exact"),
    }
    for core in ("cortex-m4", "cortex-m55"):  # measured where it ran: qemu's instruction count, flash and RAM
        firmware = checks[core]["firmware"]
        assert firmware["instructions_per_inference"] > 0 and firmware["flash_bytes"] > firmware["rodata_bytes"] > 0
    for tune in ("tune:c", "tune:onnxruntime", "tune:tract"):
        metrics = summary["metrics"][tune]
        assert metrics["goal_met"] and metrics["quantized"] >= metrics["fp32"] - 0.01 * metrics["fp32"]
