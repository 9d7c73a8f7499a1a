"""The c target's `streaming` option on 1-D conv models, bit-exact against the whole-window integer reference.

What a streaming call computes (dabuild/targets/c/streaming.py): after model_reset, the stream's output frame j
is the whole-window model's frame j on the frames from the reset on. Two checks of it per model, on this
machine's compiler:
- growing window: model_forward (a reset, then T / hop calls of model_step) equals run_integer on the window;
- sliding window: a driver of our own calls model_step over a stream of several windows, and every call's newest
  output frame (once T frames have arrived) equals the last output frame of run_integer on the T most recent
  frames; the calls' ready counts add up to the reference's frames on the first window.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from mlperf_tiny import Builder, quantized_graph

from dabuild.errors import UsageError
from dabuild.ir import Graph
from dabuild.qir.qgraph import QGraph
from dabuild.qir.reference import run_integer
from dabuild.targets.c import CTarget

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc)")

DRIVER = r"""
#include <stdio.h>
#include "model.h"

/* Every MODEL_STEP_INPUT_SIZE values of argv[1] one call after a reset; per call its ready count (int32) and
   its MODEL_STEP_OUTPUT_SIZE outputs to argv[2]. */
int main(int argc, char **argv)
{
    model_input_t frames[MODEL_STEP_INPUT_SIZE];
    model_output_t out[MODEL_STEP_OUTPUT_SIZE];
    FILE *inputs, *outputs;
    if (argc != 3 || (inputs = fopen(argv[1], "rb")) == NULL || (outputs = fopen(argv[2], "wb")) == NULL) {
        return 2;
    }
    model_reset();
    while (fread(frames, sizeof frames, 1, inputs) == 1) {
        int32_t ready = model_step(frames, out);
        if (ready < 0 || fwrite(&ready, sizeof ready, 1, outputs) != 1 || fwrite(out, sizeof out, 1, outputs) != 1) {
            return 1;
        }
    }
    return fclose(outputs) == 0 ? 0 : 1;
}
"""


def conv1d(b: Builder, x: str, channels_in: int, channels_out: int, kernel: int, pads: tuple[int, int],
           stride: int = 1, dilation: int = 1, groups: int = 1) -> str:
    weight = b.rng.standard_normal((channels_out, channels_in // groups, kernel)) * np.sqrt(2 * groups / (channels_in * kernel))
    return b.node("conv", [x, b.const(weight), b.const(b.rng.normal(0, 0.05, channels_out))], strides=[stride],
                  pads=list(pads), dilations=[dilation], groups=groups)


def causal_residual() -> Graph:
    """Causal convs of kernel 3, a dilated depthwise (kernel 5, dilation 2), pointwise, a residual add."""
    b = Builder((4, 24), seed=1)
    x = b.batch_norm(conv1d(b, "x", 4, 8, 3, (2, 0)))
    y = b.batch_norm(conv1d(b, x, 8, 8, 5, (8, 0), dilation=2, groups=8))
    y = b.batch_norm(conv1d(b, y, 8, 8, 1, (0, 0)), relu=False)
    x = b.node("relu", [b.node("add", [x, y])])
    return b.finish(conv1d(b, x, 8, 6, 2, (1, 0)))


def strided() -> Graph:
    """A causal stride-2 conv (kernel 4), then a causal depthwise and a pointwise: half the frames out."""
    b = Builder((3, 16), seed=2)
    x = b.batch_norm(conv1d(b, "x", 3, 8, 4, (3, 0), stride=2))
    x = b.batch_norm(conv1d(b, x, 8, 8, 3, (2, 0), groups=8))
    return b.finish(conv1d(b, x, 8, 5, 1, (0, 0)))


def delayed() -> Graph:
    """A valid conv (it delays its frames by 2) before a causal one: the causal conv's padding meets the warm-up."""
    b = Builder((4, 12), seed=3)
    x = b.batch_norm(conv1d(b, "x", 4, 6, 3, (0, 0)))
    return b.finish(conv1d(b, x, 6, 5, 3, (2, 0)))


def headed() -> Graph:
    """Valid depthwise-separable blocks down to one frame, flattened into a dense head (the wake-word's shape)."""
    b = Builder((6, 10), seed=4)
    x, channels = "x", 6
    for filters, kernel in ((12, 4), (8, 7)):
        x = b.batch_norm(conv1d(b, x, channels, channels, kernel, (0, 0), groups=channels))
        x, channels = b.batch_norm(conv1d(b, x, channels, filters, 1, (0, 0))), filters
    return b.finish(b.dense(b.node("flatten", [x]), channels, 4))


def branches() -> Graph:
    """Two causal branches (kernels 2 and 4, dilation 3) concatenated along the channels, then a causal conv."""
    b = Builder((3, 20), seed=11)
    left = b.batch_norm(conv1d(b, "x", 3, 4, 2, (1, 0)))
    right = b.batch_norm(conv1d(b, "x", 3, 5, 4, (9, 0), dilation=3))
    return b.finish(conv1d(b, b.node("concat", [left, right], axis=1), 9, 4, 3, (2, 0)))


MODELS: dict[str, Callable[[], Graph]] = {"causal_residual": causal_residual, "strided": strided,
                                          "delayed": delayed, "headed": headed, "branches": branches}
CASES = [("causal_residual", 1), ("causal_residual", 4), ("strided", 2), ("strided", 4), ("delayed", 1),
         ("headed", 1), ("branches", 5)]


def window_output(qgraph: QGraph, windows: np.ndarray) -> np.ndarray:
    return np.asarray(run_integer(qgraph, windows))


def last_frame(outputs: np.ndarray) -> np.ndarray:
    """The last output frame of each sample: the time axis is the last of a (C, F) output; a head's vector is it."""
    return outputs[..., -1] if outputs.ndim == 3 else outputs


def run_on_host(artifact: Path, work: Path) -> None:
    """DRIVER and the artifact's model.c built by this machine's cc, run on work/inputs.bin into work/outputs.bin."""
    (work / "driver.c").write_text(DRIVER)
    program = work / "driver"
    subprocess.run(["cc", "-std=c99", "-O2", "-Wall", "-Wextra", "-Werror", "-ffp-contract=off", f"-I{artifact}",
                    "-o", str(program), str(work / "driver.c"), str(artifact / "model.c")], check=True)
    subprocess.run([str(program), "inputs.bin", "outputs.bin"], check=True, timeout=60, cwd=work)


def check_sliding_window(qgraph: QGraph, artifact: Path, work: Path, hop: int,
                         run: Callable[[Path, Path], None] = run_on_host) -> None:
    """One stream of three windows and some, called hop by hop (`run` runs DRIVER): the calls' ready counts add
    up to the reference's frames on the first window, and every call's newest output frame once a window has
    arrived equals the last output frame of run_integer on the window of the latest frames."""
    channels, window = qgraph.tensors[qgraph.input].shape
    stream = qgraph.input_params.quantize(np.random.default_rng(5).standard_normal((channels, 3 * window + 2 * hop)))
    calls = stream.shape[1] // hop
    stream.reshape(channels, calls, hop).transpose(1, 0, 2).tofile(work / "inputs.bin")
    run(artifact, work)
    manifest = json.loads((artifact / "model.json").read_text())
    first = window_output(qgraph, stream[None, :, :window])[0]
    per_call = first.shape[0] * manifest["streaming"]["output_frames_per_call"] if first.ndim == 2 else first.size
    raw = np.fromfile(work / "outputs.bin", dtype=np.int8).reshape(calls, 4 + per_call)
    ready, outputs = raw[:, :4].copy().view(np.int32)[:, 0], raw[:, 4:]
    window_calls = window // hop
    assert ready[:window_calls].sum() == (first.shape[-1] if first.ndim == 2 else 1)
    assert np.all(ready[window_calls:] == ready.max())
    per_frame = outputs.reshape(calls, -1, ready.max()) if first.ndim == 2 else outputs[:, :, None]
    for call in range(window_calls - 1, calls):
        end = (call + 1) * hop
        reference = last_frame(window_output(qgraph, stream[None, :, end - window:end]))[0]
        assert np.array_equal(per_frame[call, :, -1], reference), f"call {call} (frames up to {end})"
    assert calls - window_calls + 1 >= 2 * window_calls


@pytest.mark.parametrize("name,hop", CASES)
def test_streaming_equals_the_whole_window_reference(name: str, hop: int, tmp_path: Path) -> None:
    qgraph, data = quantized_graph(MODELS[name]())
    target = CTarget(CTarget.Options(streaming={"hop": hop}))
    artifact = tmp_path / "artifact"
    artifact.mkdir()
    target.export(qgraph, artifact)
    # growing window: model_forward streams each sample's window through model_step
    samples = qgraph.input_params.quantize(data[:4])
    expected = window_output(qgraph, samples)
    assert np.array_equal(target.run(artifact, samples, tmp_path), expected)
    assert len(np.unique(expected)) > 1
    check_sliding_window(qgraph, artifact, tmp_path, hop)


def test_streaming_state_is_in_the_manifest(tmp_path: Path) -> None:
    """The wake-word-shaped model keeps (k - 1) frames per depthwise conv and nothing for a pointwise one."""
    qgraph, _ = quantized_graph(headed())
    CTarget(CTarget.Options(streaming=True)).export(qgraph, tmp_path)
    streaming = json.loads((tmp_path / "model.json").read_text())["streaming"]
    assert [(state["channels"], state["held_frames"]) for state in streaming["states"]] == [(6, 3), (12, 6)]
    assert streaming["state_bytes"] == 6 * 4 + 12 * 7
    assert streaming["warmup_calls"] == 9 and streaming["calls_per_window"] == 10
    assert streaming["receptive_field_frames"] == 1 + (4 - 1) + (7 - 1)


@pytest.mark.parametrize("name,reach", [("causal_residual", 1 + 2 + 4 * 2 + 1), ("strided", 1 + 3 + 2 * 2),
                                        ("delayed", 1 + 2 + 2)])
def test_the_receptive_field_counts_dilations_and_strides(name: str, reach: int, tmp_path: Path) -> None:
    qgraph, _ = quantized_graph(MODELS[name]())
    CTarget(CTarget.Options(streaming=True if name != "strided" else {"hop": 2})).export(qgraph, tmp_path)
    assert json.loads((tmp_path / "model.json").read_text())["streaming"]["receptive_field_frames"] == reach


def refused(graph: Graph) -> str:
    qgraph, _ = quantized_graph(graph)
    with pytest.raises(UsageError) as error:
        CTarget(CTarget.Options(streaming=True)).export(qgraph, Path("/nonexistent"))
    assert error.value.exit_code == 2
    return str(error.value)


def test_a_conv_padded_on_the_right_is_refused_by_name() -> None:
    b = Builder((4, 12), seed=6)
    x = b.batch_norm(conv1d(b, "x", 4, 6, 3, (2, 0)))
    x = b.batch_norm(conv1d(b, x, 6, 6, 3, (1, 1), groups=6))
    message = refused(b.finish(conv1d(b, x, 6, 4, 3, (2, 0))))
    assert "layer 'conv3' (conv) pads 1 frame on the right" in message and "look 1 frame ahead" in message


def test_a_pool_over_time_is_refused_by_name() -> None:
    b = Builder((4, 12), seed=7)
    x = b.batch_norm(conv1d(b, "x", 4, 6, 3, (2, 0)))
    message = refused(b.finish(b.dense(b.node("flatten", [b.node("global_avg_pool", [x])]), 6, 3)))
    assert "layer 'global_avg_pool3'" in message and "mixes frames" in message


def test_a_flatten_of_several_frames_is_refused_by_name() -> None:
    b = Builder((4, 6), seed=8)
    x = b.batch_norm(conv1d(b, "x", 4, 5, 3, (2, 0)))
    message = refused(b.finish(b.dense(b.node("flatten", [x]), 30, 3)))
    assert "layer 'flatten3' (flatten) mixes the 6 frames" in message


def test_a_head_needs_one_frame_a_call() -> None:
    qgraph, _ = quantized_graph(headed())
    with pytest.raises(UsageError, match="layer 'flatten12' \\(flatten\\) ends the time axis, which takes one frame a "
                                         "call there, but gets 2 \\(hop 2\\)"):
        CTarget(CTarget.Options(streaming={"hop": 2})).export(qgraph, Path("/nonexistent"))


def test_a_hop_that_does_not_divide_the_window_is_refused() -> None:
    qgraph, _ = quantized_graph(delayed())
    with pytest.raises(UsageError, match="hop 5 does not divide the window of 12 frames"):
        CTarget(CTarget.Options(streaming={"hop": 5})).export(qgraph, Path("/nonexistent"))


def test_a_recipe_builds_and_checks_a_streaming_target(tmp_path: Path, cache_dir: Path) -> None:
    """The option through the whole build: an ONNX 1-D model (the digits as 8 channels x 8 frames: a causal conv,
    a valid one down to one frame, a dense head) passes the refusal on the float graph, tunes, exports with
    model_step and checks exact against the whole-window reference."""
    pytest.importorskip("onnx", reason="the model is an ONNX file: needs dabuild[onnx]")
    from onnx import TensorProto, helper, numpy_helper, save
    from support import REPO

    from dabuild.cli import main

    rng = np.random.default_rng(12)
    initializers = [numpy_helper.from_array(rng.normal(0, 0.4, (12, 8, 3)).astype(np.float32), "causal_w"),
                    numpy_helper.from_array(rng.normal(0, 0.2, (16, 12, 8)).astype(np.float32), "valid_w"),
                    numpy_helper.from_array(rng.normal(0, 0.3, (16, 10)).astype(np.float32), "dense_w")]
    nodes = [helper.make_node("Conv", ["x", "causal_w"], ["causal"], pads=[2, 0], name="causal"),
             helper.make_node("Relu", ["causal"], ["relu"]),
             helper.make_node("Conv", ["relu", "valid_w"], ["valid"], name="valid"),
             helper.make_node("Flatten", ["valid"], ["flat"]),
             helper.make_node("MatMul", ["flat", "dense_w"], ["y"], name="dense")]
    graph = helper.make_graph(nodes, "frames", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 10])], initializers)
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "model.onnx")
    digits = np.load(REPO / "recipes" / "digits" / "data.npz")
    np.savez(tmp_path / "data.npz", x=digits["x_train"][:64].reshape(-1, 8, 8), y=digits["y_train"][:64])
    (tmp_path / "recipe.yaml").write_text("""name: frames
model: {framework: onnx, source: model.onnx}
data:
  calibration: {source: data.npz, x: x, samples: 64}
  evaluation: {source: data.npz, x: x, y: y}
  metric: accuracy
tuning: {strategy: basic, max_trials: 2, accuracy: {criterion: absolute, tolerable_loss: 1.0}}
targets:
  - {name: stream, kind: c, options: {streaming: {hop: 1}}, check_io: {tolerance: exact, samples: 8}}
""")
    assert main(["build", str(tmp_path), "--build-dir", str(tmp_path / "build"), "-q"]) == 0
    report = json.loads((tmp_path / "build" / "frames" / "build.json").read_text())
    check = report["checks"]["stream"]
    assert check["ok"] and check["tolerance"] == "exact"
    manifest = json.loads((tmp_path / "build" / "frames" / "export-stream" / "model.json").read_text())
    assert manifest["streaming"]["hop"] == 1 and manifest["streaming"]["calls_per_window"] == 8
