"""dabuild's C with rounding `tflm` against TensorFlow Lite Micro with CMSIS-NN kernels, both on a Cortex-M4 in qemu.

Each committed int8 .tflite file, rebuilt as given and exported by the c target for cortex-m4 with `rounding:
tflm`, and the file itself run by TFLM+CMSIS-NN (built from source by bench/tflm_peer.py, default double
rounding) in the same qemu board on the same samples: the outputs are bit-identical.

Needs the peer checkouts (bench/tflm_peer.py's docstring names them and their commits) in one folder named by
$DABUILD_TFLM_PEERS, gcc-arm-none-eabi and qemu-system-arm; skips saying which is missing. TFLM's objects are
cached per core ($DABUILD_TFLM_CACHE, default ~/.cache/dabuild-tflm-peer): the first run compiles them (minutes
on two cores), later runs take seconds per model.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tflite_micro", reason="needs the tflite extra: pip install 'dabuild[tflite]'")

from tflite_runtime import given_qgraph, inputs_for, model

from dabuild.qir.reference import quantize_input
from dabuild.targets.c import CTarget
from dabuild.targets.c.profiles import ARM_PACKAGES, PROFILES, QEMU_PACKAGE

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
from tflm_peer import Checkouts, PeerMissing, measure

INT8_MODELS = ["ds_cnn_int8", "resnet_block_int8", "assorted_int8"]
CPU = "cortex-m4"


def peers() -> Checkouts:
    folder = os.environ.get("DABUILD_TFLM_PEERS")
    if not folder:
        pytest.skip("set DABUILD_TFLM_PEERS to a folder of the tflite-micro, CMSIS-NN, CMSIS_6, flatbuffers, "
                    "gemmlowp and ruy checkouts (bench/tflm_peer.py says which commits)")
    for program, packages in (("arm-none-eabi-g++", ARM_PACKAGES), ("qemu-system-arm", QEMU_PACKAGE)):
        if shutil.which(program) is None:
            pytest.skip(f"needs {program}: apt-get install {packages}")
    try:
        return Checkouts(Path(folder))
    except PeerMissing as missing:
        pytest.skip(str(missing))


@pytest.mark.slow
@pytest.mark.parametrize("name", INT8_MODELS)
def test_c_with_tflm_rounding_is_bit_identical_to_tflm_cmsis_nn_in_qemu(name: str, tmp_path: Path) -> None:
    checkouts = peers()
    path = model(name)
    _, qgraph = given_qgraph(path)
    samples = quantize_input(qgraph, inputs_for(path, 16, seed=11))
    target = CTarget(CTarget.Options(cpu=CPU, rounding="tflm"))
    artifact, run = tmp_path / "artifact", tmp_path / "run"
    artifact.mkdir()
    run.mkdir()
    target.export(target.integer_graph(qgraph), artifact)
    ours = target.run(artifact, samples, run)
    peer = measure(path, qgraph, samples, PROFILES[CPU], checkouts, artifact, tmp_path / "tflm", count=False)
    assert peer.outputs.size == ours.size
    assert np.array_equal(ours.reshape(peer.outputs.shape), peer.outputs)
    assert peer.arena_bytes > 0
    assert peer.flash_bytes > path.stat().st_size  # the flatbuffer and the kernels that ran it
