"""The interpreter's fused data movement (dabuild.ir.movement): ShuffleNet's runs of reshape, transpose, concat
and slice nodes as one channel gather, bit for bit what the nodes compute one by one."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from dabuild.ir import Graph, Node, TensorSpec
from dabuild.ir.interpreter import Interpreter
from dabuild.ir.kernels import native
from dabuild.ir.movement import FusedMovement, GatherPlan

pytestmark = pytest.mark.skipif(shutil.which(native.COMPILER) is None, reason="no C compiler")


def shuffle(name: str, x: str, groups: int, channels: int, size: int) -> list[Node]:
    """ShuffleNet's channel shuffle of `groups` groups as its ONNX export spells it."""
    return [Node(f"{name}_split", "reshape", [x], [f"{name}_g"], {"shape": [0, groups, channels // groups, size, size]}),
            Node(f"{name}_swap", "transpose", [f"{name}_g"], [f"{name}_t"], {"perm": [0, 2, 1, 3, 4]}),
            Node(f"{name}_merge", "reshape", [f"{name}_t"], [f"{name}_s"], {"shape": [0, channels, size, size]})]


def shufflenet_v1_unit(groups: int = 4, channels: int = 36, size: int = 6) -> Graph:
    """Grouped 1x1 conv, shuffle, depthwise 3x3, grouped 1x1 conv: the shuffle alone between two convs."""
    rng = np.random.default_rng(7)
    constants = {"w1": rng.standard_normal((channels, channels // groups, 1, 1)).astype(np.float32),
                 "w2": rng.standard_normal((channels, 1, 3, 3)).astype(np.float32)}
    nodes = [Node("c1", "conv", ["x", "w1"], ["h"], {"groups": groups, "activation": "relu"}),
             *shuffle("s", "h", groups, channels, size),
             Node("c2", "conv", ["s_s", "w2"], ["y"], {"groups": channels, "pads": [1] * 4})]
    return Graph([TensorSpec("x", (None, channels, size, size))], ["y"], nodes, constants)


def shufflenet_v2_unit(channels: int = 20, size: int = 5) -> Graph:
    """v2's unit: split the input in halves, a conv on one, concat, shuffle of 2 groups, split again; one half
    is a graph output, the other goes through a conv."""
    half = channels // 2
    rng = np.random.default_rng(8)
    constants = {"w1": rng.standard_normal((channels, channels, 1, 1)).astype(np.float32),
                 "w2": rng.standard_normal((half, half, 1, 1)).astype(np.float32),
                 "w3": rng.standard_normal((half, half, 1, 1)).astype(np.float32)}
    halves = {"axes": [1], "steps": [1]}
    nodes = [Node("c0", "conv", ["x", "w1"], ["h"], {}),
             Node("left", "slice", ["h"], ["a"], {"starts": [0], "ends": [half], **halves}),
             Node("right", "slice", ["h"], ["b"], {"starts": [half], "ends": [channels], **halves}),
             Node("c1", "conv", ["b", "w2"], ["c"], {"activation": "relu"}),
             Node("join", "concat", ["a", "c"], ["j"], {"axis": 1}),
             *shuffle("s", "j", 2, channels, size),
             Node("left2", "slice", ["s_s"], ["a2"], {"starts": [0], "ends": [half], **halves}),
             Node("right2", "slice", ["s_s"], ["b2"], {"starts": [half], "ends": [channels], **halves}),
             Node("c2", "conv", ["b2", "w3"], ["y"], {})]
    return Graph([TensorSpec("x", (None, channels, size, size))], ["a2", "y"], nodes, constants)


def flattening_run() -> Graph:
    """A reshape that moves values between pixels: no per-pixel gather, so the run goes node by node."""
    nodes = [Node("c", "conv", ["x", "w"], ["h"], {}),
             Node("r", "reshape", ["h"], ["f"], {"shape": [0, 4, 18, 2]}),
             Node("t", "transpose", ["f"], ["y"], {"perm": [0, 1, 3, 2]})]
    weight = np.random.default_rng(9).standard_normal((4, 4, 1, 1)).astype(np.float32)
    return Graph([TensorSpec("x", (None, 4, 6, 6))], ["y"], nodes, {"w": weight})


def fused_runs(interpreter: Interpreter) -> list[FusedMovement]:
    return [step.kernel for step in interpreter.steps if isinstance(step.kernel, FusedMovement)]


@pytest.mark.parametrize("graph, gathered", [(shufflenet_v1_unit(), True), (shufflenet_v2_unit(), True),
                                              (flattening_run(), False)])
@pytest.mark.parametrize("batch", [1, 3])
def test_a_fused_run_gives_what_its_nodes_give_bit_for_bit(monkeypatch: pytest.MonkeyPatch, graph: Graph,
                                                           gathered: bool, batch: int) -> None:
    monkeypatch.delenv(native.SWITCH, raising=False)
    shape = (batch, *graph.inputs[0].shape[1:])
    feeds = {"x": np.random.default_rng(batch).standard_normal(shape).astype(np.float32)}
    interpreter = Interpreter(graph)
    fused = interpreter.run(feeds)
    runs = fused_runs(interpreter)  # each run of movement nodes is one step
    assert runs and all([plan is not None for plan in run._plans.values()] == [gathered] for run in runs)
    unfused = Interpreter(graph).run(feeds, keep_intermediates=True)  # every node alone
    monkeypatch.setenv(native.SWITCH, "0")
    numpy_only = Interpreter(graph).run(feeds)
    for name in graph.outputs:
        np.testing.assert_array_equal(fused[name], unfused[name])
        np.testing.assert_allclose(fused[name], numpy_only[name], rtol=1e-5, atol=1e-5)  # numpy's convs round
        #                                                                                   their sums otherwise


def test_gathered_outputs_are_channels_last_for_the_next_conv(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(native.SWITCH, raising=False)
    graph = shufflenet_v2_unit()
    feeds = {"x": np.random.default_rng(1).standard_normal((2, 20, 5, 5)).astype(np.float32)}
    interpreter = Interpreter(graph)
    run = fused_runs(interpreter)[-1]  # concat, shuffle, split
    values = Interpreter(graph).run(feeds, keep_intermediates=True)
    outputs = run([values[name] for name in run.inputs], None)
    assert run.outputs == ["a2", "b2"]
    for output in outputs:
        assert output.transpose(0, 2, 3, 1).flags.c_contiguous
    assert isinstance(next(iter(run._plans.values())), GatherPlan)


def test_an_input_not_held_channels_last_is_copied_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(native.SWITCH, raising=False)
    graph = shufflenet_v1_unit()
    interpreter = Interpreter(graph)
    (run,) = fused_runs(interpreter)
    x = np.random.default_rng(2).standard_normal((2, 36, 6, 6)).astype(np.float32)  # channels first
    (gathered,) = run([x], None)
    assert isinstance(next(iter(run._plans.values())), GatherPlan)
    np.testing.assert_array_equal(gathered, x.reshape(2, 4, 9, 6, 6).transpose(0, 2, 1, 3, 4).reshape(2, 36, 6, 6))
