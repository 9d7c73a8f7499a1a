"""The streaming wake-word (tests/mlperf_tiny.py's `wakeword`, a 1-D DS-CNN) as a streaming c artifact in qemu on a
Cortex-M4 (DSP kernels) and M55 (Helium): model_forward streams each 30-frame window through 30 calls of
model_step, and its outputs equal the whole-window integer reference bit for bit; a driver of our own calls
model_step over a stream of three windows and more in the same qemu, every call's output past the warm-up equal
to the reference on the latest 30 frames; the counting image reports the instructions of one hop.
"""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from mlperf_tiny import quantized
from test_c_streaming import DRIVER, check_sliding_window

from dabuild.qir.qgraph import QGraph
from dabuild.qir.reference import run_integer
from dabuild.targets.c import CTarget, firmware
from dabuild.targets.c.profiles import PROFILES

pytestmark = pytest.mark.skipif(shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None,
                                reason="needs gcc-arm-none-eabi, libnewlib-arm-none-eabi and qemu-system-arm")


@functools.cache
def wakeword() -> tuple[QGraph, np.ndarray]:
    qgraph, data = quantized("wakeword")
    return qgraph, qgraph.input_params.quantize(data[:3])


@pytest.mark.parametrize("cpu", ["cortex-m4", "cortex-m55"])
def test_streaming_wakeword_is_exact_in_qemu(cpu: str, tmp_path: Path) -> None:
    qgraph, samples = wakeword()
    target = CTarget(CTarget.Options(cpu=cpu, streaming=True))
    for folder in ("artifact", "run", "count"):
        (tmp_path / folder).mkdir()
    target.export(qgraph, tmp_path / "artifact")
    actual = target.run(tmp_path / "artifact", samples, tmp_path / "run")
    expected = np.asarray(run_integer(qgraph, samples))
    assert np.array_equal(actual, expected) and len(np.unique(expected)) > 1
    manifest = json.loads((tmp_path / "artifact" / "model.json").read_text())
    state = manifest["streaming"]["state_bytes"]
    # each depthwise conv keeps (kernel - 1) frames and gets the hop's one: kernel frames of its channels
    assert state == sum(channels * kernel for channels, kernel in ((40, 3), (128, 5), (64, 10), (64, 15)))
    assert manifest["firmware"]["bss_bytes"] >= state + manifest["arena_bytes"]   # the state is RAM the budget sees
    measured = target.measurements(tmp_path / "artifact", samples, tmp_path / "count")["firmware"]
    assert 0 < measured["instructions_per_hop"] * 30 <= measured["instructions_per_inference"]
    assert measured["state_bytes"] == state   # the check report's figures (build.json, report page) give it


def test_the_tuner_counts_the_streaming_state_in_ram(tmp_path: Path) -> None:
    """A RAM budget between the streaming image's RAM without its state and with it: the tuner's fits() says the
    artifact overflows, so the state is part of what the budget sees."""
    qgraph, _ = wakeword()
    CTarget(CTarget.Options(cpu="cortex-m4", streaming=True)).export(qgraph, tmp_path)
    manifest = json.loads((tmp_path / "model.json").read_text())
    ram, state = manifest["firmware"]["ram_bytes"], manifest["streaming"]["state_bytes"]
    budget = ram - state // 2
    reason = CTarget(CTarget.Options(cpu="cortex-m4", streaming=True, budget={"ram": budget})).fits(qgraph)
    assert reason == f"cortex-m4: ram {ram} bytes exceeds the budget of {budget} by {state // 2}"


@pytest.mark.parametrize("cpu", ["cortex-m4", "cortex-m55"])
def test_streaming_wakeword_calls_follow_the_sliding_window_in_qemu(cpu: str, tmp_path: Path) -> None:
    qgraph, _ = wakeword()
    artifact = tmp_path / "artifact"
    artifact.mkdir()
    CTarget(CTarget.Options(cpu=cpu, streaming=True)).export(qgraph, artifact)

    def run_in_qemu(artifact: Path, work: Path) -> None:
        """The artifact's image with DRIVER as its main.c, booted in qemu in `work` (inputs.bin, outputs.bin)."""
        (artifact / "main.c").write_text(DRIVER)
        image = firmware.build_image(PROFILES[cpu], ["-O2"], artifact, work / "image")
        firmware.run_image(PROFILES[cpu], image.elf, work, 600)

    check_sliding_window(qgraph, artifact, tmp_path, 1, run_in_qemu)
