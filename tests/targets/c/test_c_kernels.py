"""Every C kernel against dabuild's integer reference, bit for bit, compiled with -Werror.

Each case is a small float graph, calibrated and lowered through quantize(),
exported, compiled (-std=c99 -Wall -Wextra -Werror -pedantic) and run on a
few hundred full-range random int8 inputs. Then a small CNN with every kind
of layer end to end, the arena planner's bounds on these models, and the
errors for what the C target cannot run.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from test_lowering import graph_of, image, lower, with_weights
from test_quantize import C_CAPABILITY

from dabuild.errors import BuildError
from dabuild.ir import Graph, Node
from dabuild.qir.fixed_point import ROUNDINGS, requantize
from dabuild.qir.qgraph import QGraph
from dabuild.qir.reference import run_integer
from dabuild.quant.defaults import default_config
from dabuild.targets.c import CTarget
from dabuild.targets.c.codegen import COMMON_HEADER, render

STRICT = ["-O2", "-Wall", "-Wextra", "-Werror", "-pedantic"]
SAMPLES = 300
RNG = np.random.default_rng(21)


def weights(*shape: int, scale: float = 0.3) -> np.ndarray:
    return RNG.normal(0, scale, shape)


def conv_node(name: str, source: str, output: str, **attrs: object) -> Node:
    return Node(name, "conv", [source, f"{name}_w", f"{name}_b"], [output], dict(attrs))


# name: (nodes, input shape, constants, weight granularity, kernels the export must use)
CASES: dict[str, tuple[list[Node], tuple[int, ...], dict[str, np.ndarray], str, set[str]]] = {
    "dense per tensor": ([Node("fc", "dense", ["x", "w", "b"], ["y"], {})], (20,),
                         {"w": weights(20, 9), "b": weights(9)}, "per_tensor", {"dense"}),
    "dense per channel relu6": ([Node("fc", "dense", ["x", "w", "b"], ["y"], {"activation": "relu6"})], (37,),
                                {"w": weights(37, 5), "b": weights(5)}, "per_channel", {"dense"}),
    "dense rank 3 with sigmoid": ([Node("fc", "dense", ["x", "w"], ["y"], {"activation": "sigmoid"})], (5, 6),
                                  {"w": weights(6, 4)}, "per_tensor", {"dense", "lookup"}),
    "conv 3x3 pad 1": ([conv_node("c", "x", "y", pads=[1, 1, 1, 1])], (4, 7, 7),
                       {"c_w": weights(6, 4, 3, 3), "c_b": weights(6)}, "per_tensor", {"conv", "gather"}),
    "conv stride 2 asymmetric pads per channel": (
        [conv_node("c", "x", "y", strides=[2, 2], pads=[0, 1, 1, 0], activation="relu")], (4, 7, 7),
        {"c_w": weights(6, 4, 3, 3), "c_b": weights(6)}, "per_channel", {"conv"}),
    "conv dilation 2 clip": ([conv_node("c", "x", "y", dilations=[2, 2], pads=[2, 2, 2, 2], activation="clip",
                                        activation_attrs={"min": -0.5, "max": 1.0})], (5, 6, 8),
                             {"c_w": weights(5, 5, 3, 3), "c_b": weights(5)}, "per_tensor", {"conv"}),
    "conv groups 2": ([conv_node("c", "x", "y", groups=2, pads=[1, 1, 1, 1])], (4, 7, 7),
                      {"c_w": weights(6, 2, 3, 3), "c_b": weights(6)}, "per_channel", {"conv"}),
    "conv 1x1 no pad": ([conv_node("c", "x", "y")], (16, 5, 5), {"c_w": weights(24, 16, 1, 1),
                                                                 "c_b": weights(24)}, "per_tensor", {"conv"}),
    "conv 1x1 8 channels": ([conv_node("c", "x", "y")], (8, 5, 5), {"c_w": weights(16, 8, 1, 1),   # pairs unrolled
                                                                     "c_b": weights(16)}, "per_channel", {"conv"}),
    "conv 1x1 int8 pairs": ([conv_node("c", "x", "y")], (272, 3, 3), {"c_w": weights(128, 272, 1, 1),   # > 32 KB
                                                                        "c_b": weights(128)}, "per_channel", {"conv"}),
    "conv rgb stride 2 whole tiles": (   # the M4 im2col conv on rows of whole 3-pixel tiles, as VWW's stem
        [conv_node("c", "x", "y", strides=[2, 2], pads=[0, 0, 1, 1])], (3, 12, 12),
        {"c_w": weights(8, 3, 3, 3), "c_b": weights(8)}, "per_channel", {"conv"}),
    "conv 3x3 pad 1 wide rows": ([conv_node("c", "x", "y", pads=[1, 1, 1, 1])], (16, 6, 6),
                                 {"c_w": weights(5, 16, 3, 3), "c_b": weights(5)}, "per_channel", {"conv"}),
    "conv1d": ([conv_node("c", "x", "y", strides=[2], pads=[1, 2])], (3, 20),
               {"c_w": weights(5, 3, 4), "c_b": weights(5)}, "per_tensor", {"conv"}),
    "depthwise": ([conv_node("c", "x", "y", groups=4, pads=[1, 1, 1, 1], activation="relu")], (4, 7, 7),
                  {"c_w": weights(4, 1, 3, 3), "c_b": weights(4)}, "per_channel", {"conv_depthwise"}),
    "depthwise multiplier 2 stride": ([conv_node("c", "x", "y", groups=4, strides=[2, 1])], (4, 7, 7),
                                      {"c_w": weights(8, 1, 3, 3), "c_b": weights(8)}, "per_tensor",
                                      {"conv_depthwise"}),
    "depthwise dilated stride past the band": (   # a 2x3 window dilated 2 rows spans 3 rows; stride 4 skips one
        [conv_node("c", "x", "y", groups=8, dilations=[2, 1], strides=[4, 2], pads=[1, 1, 2, 0],
                   activation="relu")], (8, 13, 11),
        {"c_w": weights(8, 1, 2, 3), "c_b": weights(8)}, "per_channel", {"conv_depthwise"}),
    "depthwise 12 channels dilated columns stride 2": (   # three 4-channel words per tap, taps 2 pixels apart
        [conv_node("c", "x", "y", groups=12, dilations=[1, 2], strides=[1, 2], pads=[1, 2, 1, 2])], (12, 6, 9),
        {"c_w": weights(12, 1, 3, 3), "c_b": weights(12)}, "per_channel", {"conv_depthwise"}),
    "depthwise 8 channels wide rows stride 2 down": (   # rows past the unrolled width, an odd last output, chunks
        [conv_node("c", "x", "y", groups=8, strides=[2, 1], pads=[1, 1, 1, 1], activation="relu")], (8, 19, 51),
        {"c_w": weights(8, 1, 3, 3), "c_b": weights(8)}, "per_tensor", {"conv_depthwise"}),
    "depthwise 8 channels even rows": (   # the planar loop's widening four pixels a step then two, no odd last pixel
        [conv_node("c", "x", "y", groups=8, pads=[1, 1, 1, 1], activation="relu")], (8, 6, 10),
        {"c_w": weights(8, 1, 3, 3), "c_b": weights(8)}, "per_channel", {"conv_depthwise"}),
    "depthwise 4 channels rows of 4k + 1 one-sided pads": (   # widened 4 pixels a step, then an odd one; top, right pads
        [conv_node("c", "x", "y", groups=4, pads=[1, 0, 0, 1], activation="relu")], (4, 5, 9),
        {"c_w": weights(4, 1, 3, 3), "c_b": weights(4)}, "per_tensor", {"conv_depthwise"}),
    "depthwise 8 channels rows of 3": (   # the planar loop's narrowest rows: one pair and an odd last output
        [conv_node("c", "x", "y", groups=8, pads=[1, 1, 1, 1])], (8, 4, 3),
        {"c_w": weights(8, 1, 3, 3), "c_b": weights(8)}, "per_channel", {"conv_depthwise"}),
    "depthwise 6 channels asymmetric pads": ([conv_node("c", "x", "y", groups=6, pads=[0, 1, 1, 0])], (6, 5, 6),
                                             {"c_w": weights(6, 1, 3, 3), "c_b": weights(6)}, "per_tensor",
                                             {"conv_depthwise"}),
    "relu": ([Node("a", "relu", ["x"], ["y"], {})], (10,), {}, "per_tensor", {"clamp"}),
    "relu6": ([Node("a", "relu6", ["x"], ["y"], {})], (10,), {}, "per_tensor", {"clamp"}),
    "clip": ([Node("a", "clip", ["x"], ["y"], {"min": -1.0, "max": 0.5})], (3, 4), {}, "per_tensor", {"clamp"}),
    "tanh": ([Node("a", "tanh", ["x"], ["y"], {})], (10,), {}, "per_tensor", {"lookup"}),
    "gelu": ([Node("a", "gelu", ["x"], ["y"], {})], (2, 5), {}, "per_tensor", {"lookup"}),
    "elu then exp": ([Node("a", "elu", ["x"], ["e"], {"alpha": 0.5}), Node("b", "exp", ["e"], ["y"], {})], (2, 5), {},
                     "per_tensor", {"lookup"}),
    "add broadcast constant": ([conv_node("c", "x", "c_out"), Node("plus", "add", ["c_out", "shift"], ["y"], {})],
                               (4, 5, 5), {"c_w": weights(4, 4, 1, 1), "c_b": weights(4),
                                           "shift": weights(4, 1, 1, scale=1.0)}, "per_tensor", {"add"}),
    "add of feature maps": ([conv_node("c", "x", "a"), conv_node("d", "x", "b", pads=[1, 1, 1, 1]),
                             Node("plus", "add", ["a", "b"], ["y"], {})], (3, 5, 5),
                            {"c_w": weights(3, 3, 1, 1), "c_b": weights(3), "d_w": weights(3, 3, 3, 3),
                             "d_b": weights(3)}, "per_tensor", {"add"}),
    "add of feature maps then relu": (   # the relu fused into the add (no step of its own); 75 values, 4 | 72
        [conv_node("c", "x", "a"), conv_node("d", "x", "b", pads=[1, 1, 1, 1]), Node("plus", "add", ["a", "b"], ["s"], {}),
         Node("r", "relu", ["s"], ["y"], {})], (3, 5, 5),
        {"c_w": weights(3, 3, 1, 1), "c_b": weights(3), "d_w": weights(3, 3, 3, 3), "d_b": weights(3)}, "per_tensor",
        {"add"}),
    "sub of feature maps": ([conv_node("c", "x", "a"), conv_node("d", "x", "b", pads=[1, 1, 1, 1]),
                             Node("minus", "sub", ["a", "b"], ["y"], {})], (3, 5, 5),
                            {"c_w": weights(3, 3, 1, 1), "c_b": weights(3), "d_w": weights(3, 3, 3, 3),
                             "d_b": weights(3)}, "per_tensor", {"add"}),
    "mul of feature maps": ([conv_node("c", "x", "a"), conv_node("d", "x", "b", pads=[1, 1, 1, 1]),
                             Node("times", "mul", ["a", "b"], ["y"], {})], (3, 5, 5),
                            {"c_w": weights(4, 3, 1, 1), "c_b": weights(4), "d_w": weights(4, 3, 3, 3),
                             "d_b": weights(4)}, "per_tensor", {"mul"}),
    "sub broadcast rows": ([Node("fa", "dense", ["x", "wa"], ["a"], {}), Node("m", "reduce_mean", ["a"], ["r"],
                                                                              {"axes": [2], "keepdims": True}),
                            Node("minus", "sub", ["a", "r"], ["y"], {})], (3, 8), {"wa": weights(8, 6)},
                           "per_tensor", {"add", "mean"}),
    "concat channels": ([conv_node("c", "x", "a"), conv_node("d", "x", "b", pads=[1, 1, 1, 1]),
                         Node("join", "concat", ["a", "b"], ["y"], {"axis": 1})], (3, 5, 5),
                        {"c_w": weights(4, 3, 1, 1), "c_b": weights(4), "d_w": weights(2, 3, 3, 3),
                         "d_b": weights(2, scale=3.0)}, "per_tensor", {"concat"}),
    "concat width": ([Node("s", "split", ["x"], ["l", "r"], {"axis": 3, "sizes": [2, 3]}),
                      Node("act", "tanh", ["r"], ["t"], {}), Node("join", "concat", ["t", "l"], ["y"], {"axis": 3})],
                     (2, 3, 5), {}, "per_tensor", {"concat", "gather"}),
    "max_pool 2x2": ([Node("p", "max_pool", ["x"], ["y"], {"kernel": [2, 2]})], (4, 7, 7), {}, "per_tensor",
                     {"max_pool"}),
    "max_pool 3x3 s2 pads ceil": ([Node("p", "max_pool", ["x"], ["y"], {"kernel": [3, 3], "strides": [2, 2],
                                                                        "pads": [1, 1, 1, 1], "ceil_mode": True})],
                                  (3, 8, 7), {}, "per_tensor", {"max_pool"}),
    "avg_pool 3x3 pads excluded": ([Node("p", "avg_pool", ["x"], ["y"], {"kernel": [3, 3], "strides": [1, 1],
                                                                         "pads": [1, 1, 1, 1]})], (4, 7, 7), {},
                                   "per_tensor", {"avg_pool"}),
    "avg_pool 3x3 pads counted ceil": ([Node("p", "avg_pool", ["x"], ["y"], {
        "kernel": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": True, "ceil_mode": True})],
        (4, 8, 7), {}, "per_tensor", {"avg_pool"}),
    # torch's opset-8 export of a ceil-mode pool pads its end past the kernel (Inception)
    "max_pool padded past its kernel": ([Node("p", "max_pool", ["x"], ["y"], {"kernel": [3, 3], "strides": [2, 2],
                                                                              "pads": [1, 1, 3, 3]})],
                                        (3, 8, 8), {}, "per_tensor", {"max_pool"}),
    "avg_pool padded past its kernel": ([Node("p", "avg_pool", ["x"], ["y"], {"kernel": [3, 3], "strides": [2, 2],
                                                                              "pads": [1, 1, 3, 3]})],
                                        (3, 8, 8), {}, "per_tensor", {"avg_pool"}),
    "avg_pool 1-D": ([Node("p", "avg_pool", ["x"], ["y"], {"kernel": [3], "strides": [2], "pads": [1, 1]})],
                     (3, 11), {}, "per_tensor", {"avg_pool"}),
    "global_avg_pool": ([Node("p", "global_avg_pool", ["x"], ["y"], {})], (4, 7, 7), {}, "per_tensor", {"mean"}),
    "reduce_mean spatial": ([Node("p", "reduce_mean", ["x"], ["y"], {"axes": [2, 3], "keepdims": False})],
                            (4, 7, 7), {}, "per_tensor", {"mean"}),
    "reduce_sum channels": ([Node("p", "reduce_sum", ["x"], ["y"], {"axes": [1]})], (4, 7, 7), {}, "per_tensor",
                            {"mean"}),
    "reduce_max last axis": ([Node("p", "reduce_max", ["x"], ["y"], {"axes": [-1]})], (4, 7, 7), {},
                             "per_tensor", {"reduce_max"}),
    "reduce_max of feature maps": ([conv_node("c", "x", "a", pads=[1, 1, 1, 1]),
                                    Node("p", "reduce_max", ["a"], ["y"], {"axes": [1, 3], "keepdims": False})],
                                   (3, 5, 6), {"c_w": weights(4, 3, 3, 3), "c_b": weights(4)}, "per_tensor",
                                   {"reduce_max"}),
    "softmax vector": ([Node("s", "softmax", ["x"], ["y"], {"axis": -1})], (10,), {}, "per_tensor", {"softmax"}),
    "softmax middle axis": ([Node("s", "softmax", ["x"], ["y"], {"axis": 1})], (3, 6), {}, "per_tensor",
                            {"softmax"}),
    "softmax over channels": ([conv_node("c", "x", "a", pads=[1, 1, 1, 1]),
                               Node("s", "softmax", ["a"], ["y"], {"axis": 1})], (3, 5, 5),
                              {"c_w": weights(6, 3, 3, 3), "c_b": weights(6)}, "per_tensor", {"softmax"}),
    "reshape and flatten alias": ([Node("r", "reshape", ["x"], ["a"], {"shape": [0, 5, -1]}),
                                   Node("t", "tanh", ["a"], ["b"], {}), Node("f", "flatten", ["b"], ["y"], {})],
                                  (3, 1, 5), {}, "per_tensor", {"lookup"}),
    "squeeze unsqueeze": ([Node("s", "squeeze", ["x"], ["a"], {"axes": [2]}), Node("t", "tanh", ["a"], ["b"], {}),
                           Node("u", "unsqueeze", ["b"], ["y"], {"axes": [1]})], (3, 1, 5), {}, "per_tensor",
                          {"lookup"}),
    "transpose": ([Node("t", "transpose", ["x"], ["y"], {"perm": [0, 3, 1, 2]})], (3, 2, 5), {}, "per_tensor",
                  {"gather"}),
    "transpose of feature maps": ([conv_node("c", "x", "a", pads=[1, 1, 1, 1]),
                                   Node("t", "transpose", ["a"], ["y"], {"perm": [0, 2, 3, 1]})], (3, 4, 5),
                                  {"c_w": weights(4, 3, 3, 3), "c_b": weights(4)}, "per_tensor", {"gather"}),
    "conv of an NHWC input": ([Node("t", "transpose", ["x"], ["xt"], {"perm": [0, 3, 1, 2]}),   # rows of 48 bytes
                               conv_node("c", "xt", "y", pads=[1, 1, 1, 1])], (5, 6, 16),
                              {"c_w": weights(6, 16, 3, 3), "c_b": weights(6)}, "per_channel", {"conv"}),
    "slice steps": ([Node("s", "slice", ["x"], ["y"], {"starts": [1, 0, -1], "ends": [3, 5, -6], "axes": [1, 3, 2],
                                                       "steps": [1, 2, -2]})], (3, 6, 5), {}, "per_tensor",
                    {"gather"}),
    "split": ([Node("s", "split", ["x"], ["a", "b"], {"axis": 2, "sizes": [2, 4]}),
               Node("m", "mul", ["a", "a"], ["p"], {}), Node("red", "reduce_max", ["b"], ["q"], {"axes": [2]}),
               Node("j", "concat", ["p", "q"], ["y"], {"axis": 2})], (3, 6, 2), {}, "per_tensor", {"gather"}),
    "pad constant": ([Node("p", "pad", ["x"], ["y"], {"pads": [0, 0, 1, 2, 0, 0, 3, 0]})], (3, 2, 5), {},
                     "per_tensor", {"pad"}),
    "pad edge": ([Node("p", "pad", ["x"], ["y"], {"pads": [0, 0, 1, 1, 0, 0, 1, 1], "mode": "edge"})], (3, 2, 5),
                 {}, "per_tensor", {"pad"}),
    "gather tile expand": ([Node("g", "gather", ["x"], ["a"], {"axis": 3, "indices": [[4, 0], [2, -1]]}),
                            Node("t", "tile", ["a"], ["b"], {"repeats": [1, 1, 1, 2, 1]}),
                            Node("e", "expand", ["b"], ["y"], {"shape": [1, 3, 4, 4, 2]})], (3, 1, 5), {},
                           "per_tensor", {"indexed"}),
    "resize nearest": ([conv_node("c", "x", "a"), Node("r", "resize", ["a"], ["y"], {
        "sizes": [1, 4, 7, 10], "scales": [1, 1, 7 / 3, 2], "coordinate_transformation_mode": "half_pixel"})],
        (3, 3, 5), {"c_w": weights(4, 3, 1, 1), "c_b": weights(4)}, "per_tensor", {"indexed"}),
    "resize linear two axes": ([conv_node("c", "x", "a"), Node("r", "resize", ["a"], ["y"], {
        "sizes": [1, 4, 7, 10], "scales": [1, 1, 7 / 3, 2], "mode": "linear"})],
        (3, 3, 5), {"c_w": weights(4, 3, 1, 1), "c_b": weights(4)}, "per_tensor", {"resize_linear"}),
    "resize linear last axis align corners": ([Node("r", "resize", ["x"], ["y"], {
        "sizes": [1, 3, 11], "scales": [1, 1, 11 / 4], "mode": "linear",
        "coordinate_transformation_mode": "align_corners"})], (3, 4), {}, "per_tensor", {"resize_linear"}),
    "resize linear rows only": ([Node("r", "resize", ["x"], ["y"], {
        "sizes": [1, 2, 6, 3], "scales": [1, 1, 2, 1], "mode": "linear"})], (2, 3, 3), {}, "per_tensor",
        {"resize_linear"}),
    "max min of feature maps": ([conv_node("c", "x", "a"), conv_node("d", "x", "b", pads=[1, 1, 1, 1]),
                                 Node("big", "max", ["a", "b"], ["m"], {}), Node("small", "min", ["m", "x"], ["y"], {})],
                                (3, 5, 5), {"c_w": weights(3, 3, 1, 1), "c_b": weights(3), "d_w": weights(3, 3, 3, 3),
                                            "d_b": weights(3, scale=2.0)}, "per_tensor", {"pick"}),
    "where constant condition": ([conv_node("c", "x", "a"), Node("w", "where", ["mask", "a", "x"], ["y"], {})],
                                 (3, 4, 5), {"c_w": weights(3, 3, 1, 1), "c_b": weights(3),
                                             "mask": RNG.uniform(size=(4, 5)) > 0.5}, "per_tensor", {"pick"}),
    "matmul of activations": ([Node("q", "dense", ["x", "wq"], ["a"], {}), Node("k", "dense", ["x", "wk"], ["b"], {}),
                               Node("t", "transpose", ["b"], ["bt"], {"perm": [0, 2, 1]}),
                               Node("scores", "matmul", ["a", "bt"], ["y"], {})], (4, 6),
                              {"wq": weights(6, 5), "wk": weights(6, 5)}, "per_tensor", {"matmul"}),
    "conv_transpose stride 2 groups output padding": (
        [Node("up", "conv_transpose", ["x", "up_w", "up_b"], ["y"], {
            "strides": [2, 2], "pads": [1, 0, 1, 1], "groups": 2, "output_padding": [1, 0]})],
        (4, 3, 4), {"up_w": weights(4, 3, 3, 2), "up_b": weights(6)}, "per_channel", {"conv_transpose"}),
    "conv_transpose 1-D dilated": ([Node("up", "conv_transpose", ["x", "up_w"], ["y"], {"dilations": [2], "strides": [3]})],
                                   (3, 5), {"up_w": weights(3, 4, 3)}, "per_tensor", {"conv_transpose"}),
    "prelu per channel": ([conv_node("c", "x", "a", pads=[1, 1, 1, 1]), Node("p", "prelu", ["a", "slope"], ["y"], {})],
                          (3, 4, 5), {"c_w": weights(4, 3, 3, 3), "c_b": weights(4),
                                      "slope": np.array([0.25, -0.5, 0.0, 1.5]).reshape(4, 1, 1)}, "per_tensor",
                          {"prelu"}),
    "pad reflect of feature maps": ([conv_node("c", "x", "a"), Node("p", "pad", ["a"], ["y"], {
        "pads": [0, 0, 2, 1, 0, 0, 1, 2], "mode": "reflect"})], (3, 4, 5),
        {"c_w": weights(4, 3, 1, 1), "c_b": weights(4)}, "per_tensor", {"pad"}),
}


def build_and_run(qgraph: QGraph, folder: Path, compiler: str = "cc") -> tuple[np.ndarray, np.ndarray, dict]:
    """Export, compile strictly, run SAMPLES random int8 inputs; (C outputs, reference outputs, manifest)."""
    target = CTarget(CTarget.Options(compiler=compiler, cflags=STRICT))
    artifact = folder / "artifact"
    artifact.mkdir(parents=True)
    target.export(qgraph, artifact)
    shape = qgraph.tensors[qgraph.input].shape
    x_q = np.random.default_rng(22).integers(-128, 128, (SAMPLES, *shape)).astype(np.int8)
    actual = target.run(artifact, x_q, folder)
    expected = np.asarray(run_integer(qgraph, x_q))  # run keeps the reference's shape, whatever its rank
    return actual, expected, json.loads((artifact / "model.json").read_text())


def lowered(case: str) -> QGraph:
    nodes, shape, constants, granularity, _ = CASES[case]
    graph = graph_of(nodes, shape, constants)
    x = image(128, shape, seed=3) * 2
    return lower(graph, x, with_weights(default_config(graph, C_CAPABILITY), granularity=granularity))


@pytest.mark.parametrize("case", sorted(CASES))
def test_kernel_equals_the_integer_reference(case: str, tmp_path: Path) -> None:
    qgraph = lowered(case)
    actual, expected, manifest = build_and_run(qgraph, tmp_path)
    assert actual.shape == expected.shape
    assert np.array_equal(actual, expected), f"{np.sum(actual != expected)} of {expected.size} outputs differ"
    assert len(np.unique(expected)) > 3  # the case exercises real values, not one saturated constant
    assert CASES[case][4] <= set(manifest["kernels"].values())
    if "then relu" in case:   # fused: the relu after the add has no step
        assert "r" not in manifest["kernels"] and manifest["kernels"]["plus"] == "add"
    arena = manifest["arena"]
    assert arena["lower_bound_bytes"] <= arena["peak_bytes"] <= 1.05 * arena["lower_bound_bytes"]


def test_an_nhwc_input_reaches_the_conv_as_it_comes(tmp_path: Path) -> None:
    """The transpose of an NHWC input to the IR's NCHW is a view of the input's bytes, channels last as the conv
    wants them: no step copies the input (the conv's output still leaves through a conversion to canonical)."""
    actual, expected, manifest = build_and_run(lowered("conv of an NHWC input"), tmp_path)
    assert np.array_equal(actual, expected)
    assert "t" not in manifest["kernels"] and "x@channels_last" not in manifest["kernels"]
    assert list(manifest["kernels"].values()) == ["conv", "gather"]


def requantize_cases() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(acc, multiplier, shift) at every shift 1..62: extremes, zero (a multiplier of 0 too), random values, and exact ties
    (acc * multiplier an odd multiple of 2^(shift - 1)) of both signs."""
    rng = np.random.default_rng(24)
    cases: list[tuple[int, int, int]] = []
    for shift in range(1, 63):
        cases += [(acc, multiplier, shift) for acc, multiplier in
                  [(0, 2**31 - 1), (2**31 - 1, 2**31 - 1), (-(2**31 - 1), 2**31 - 1), (1, 1), (-1, 1), (-7, 0)]]
        cases += [(int(rng.integers(-(2**31) + 1, 2**31)), int(rng.integers(1, 2**31)), shift) for _ in range(20)]
        low = min(shift - 1, 30)  # a tie: (2j + 1) * 2^(shift - 1) as multiplier 2^low times acc (2j + 1) * 2^rest
        rest = shift - 1 - low
        if rest <= 27:
            cases += [(sign * odd * 2**rest, 2**low, shift) for odd in (1, 3, 7) for sign in (1, -1)]
    acc, multiplier, shift = zip(*cases)
    return np.array(acc, np.int64), np.array(multiplier, np.int64), np.array(shift, np.int64)


def c_requantized(function: str, acc_type: str, rounding: str, cases: tuple[np.ndarray, np.ndarray, np.ndarray],
                  folder: Path) -> np.ndarray:
    """`function` of the common header rendered for `rounding` (dabuild_requantize or dabuild_requantize32, its
    sum of C type `acc_type`) on every (acc, multiplier, shift) of `cases`, compiled with cc and run here."""
    header = render(dataclasses.replace(lowered("relu"), rounding=rounding)).files[COMMON_HEADER]
    (folder / COMMON_HEADER).write_text(header)
    rows = ",\n".join(f"{{{a}LL, {m}, {s}}}" for a, m, s in zip(*cases))
    (folder / "check.c").write_text(f"""#include <stdio.h>
#include "{COMMON_HEADER}"
static const struct {{ long long acc; int32_t multiplier; int32_t shift; }} cases[] = {{
{rows}
}};
int main(void)
{{
    size_t i;
    for (i = 0; i < sizeof cases / sizeof cases[0]; ++i) {{
        printf("%lld\\n", (long long){function}(({acc_type})cases[i].acc, cases[i].multiplier, cases[i].shift));
    }}
    return 0;
}}
""")
    subprocess.run(["cc", "-std=c99", *STRICT, "-Wno-long-long", "-o", str(folder / "check"), str(folder / "check.c")],
                   check=True)
    printed = subprocess.run([str(folder / "check")], capture_output=True, text=True, check=True).stdout
    return np.array(printed.split(), np.int64)


def test_c_requantize_matches_the_reference_rounding(tmp_path: Path) -> None:
    """dabuild_requantize (branch-free, through uint64) rounds ties away from zero exactly as the reference."""
    cases = requantize_cases()
    assert np.array_equal(c_requantized("dabuild_requantize", "int64_t", "dabuild", cases, tmp_path),
                          requantize(*cases))


@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_c_requantize32_matches_the_reference_in_every_rounding(rounding: str, tmp_path: Path) -> None:
    """dabuild_requantize32 (an int32 sum, shift 32..62: the 32-bit word paths) on requantize_cases' extremes,
    random values and ties of both signs equals the reference's requantize in each rounding."""
    acc, multiplier, shift = requantize_cases()
    taken = (shift >= 32) & (np.abs(acc) <= 2**31 - 1)
    cases = (acc[taken], multiplier[taken], shift[taken])
    assert len(cases[0]) > 900
    assert np.array_equal(c_requantized("dabuild_requantize32", "int32_t", rounding, cases, tmp_path),
                          requantize(*cases, rounding))


def small_cnn(seed: int = 5, depthwise_pads: tuple[int, ...] = (1, 1, 1, 1),
              pool_pads: tuple[int, ...] = (1, 1, 1, 1)) -> Graph:
    """conv -> depthwise -> pointwise + residual add -> max_pool and avg_pool branches concatenated
    -> global average -> dense -> softmax."""
    rng = np.random.default_rng(seed)
    constants = {"c1_w": rng.normal(0, 0.3, (8, 1, 3, 3)), "c1_b": rng.normal(0, 0.1, 8),
                 "dw_w": rng.normal(0, 0.3, (8, 1, 3, 3)), "dw_b": rng.normal(0, 0.1, 8),
                 "pw_w": rng.normal(0, 0.3, (8, 8, 1, 1)), "pw_b": rng.normal(0, 0.1, 8),
                 "fc_w": rng.normal(0, 0.5, (16, 10)), "fc_b": rng.normal(0, 0.1, 10)}
    nodes = [
        Node("image", "reshape", ["x"], ["img"], {"shape": [0, 1, 8, 8]}),
        conv_node("c1", "img", "h1", pads=[1, 1, 1, 1], activation="relu"),
        conv_node("dw", "h1", "h2", pads=list(depthwise_pads), groups=8, activation="relu6"),
        conv_node("pw", "h2", "h3"),
        Node("residual", "add", ["h3", "h1"], ["r"], {}),
        Node("maxp", "max_pool", ["r"], ["m"], {"kernel": [2, 2]}),
        Node("avgp", "avg_pool", ["r"], ["a"], {"kernel": [3, 3], "strides": [2, 2], "pads": list(pool_pads)}),
        Node("both", "concat", ["m", "a"], ["c"], {"axis": 1}),
        Node("gap", "global_avg_pool", ["c"], ["g"], {}),
        Node("flat", "flatten", ["g"], ["f"], {}),
        Node("fc", "dense", ["f", "fc_w", "fc_b"], ["logits"], {}),
        Node("soft", "softmax", ["logits"], ["y"], {"axis": -1}),
    ]
    return graph_of(nodes, (64,), constants)


@pytest.mark.parametrize("granularity", ["per_tensor", "per_channel"])
def test_small_cnn_is_exact_end_to_end(granularity: str, tmp_path: Path) -> None:
    graph = small_cnn()
    config = with_weights(default_config(graph, C_CAPABILITY), granularity=granularity)
    qgraph = lower(graph, image(200, (64,), seed=8) * 2, config)
    actual, expected, manifest = build_and_run(qgraph, tmp_path)
    assert np.array_equal(actual, expected)
    kernels = manifest["kernels"]
    assert kernels["dw"] == "conv_depthwise" and kernels["pw"] == "conv" and "image" not in kernels  # an alias
    assert kernels["c1"] == "conv_depthwise"  # one input channel: depthwise with a multiplier of 8
    arena = manifest["arena"]
    assert arena["peak_bytes"] <= 1.05 * arena["lower_bound_bytes"]
    assert arena["peak_bytes"] < arena["naive_bytes"]


def test_clang_builds_the_same_bits(tmp_path: Path) -> None:
    if shutil.which("clang") is None:
        pytest.skip("clang is not installed (apt-get install clang)")
    qgraph = lower(small_cnn(), image(200, (64,), seed=8) * 2)
    actual, expected, _ = build_and_run(qgraph, tmp_path, compiler="clang")
    assert np.array_equal(actual, expected)


@pytest.mark.parametrize("case", ["conv stride 2 asymmetric pads per channel", "conv groups 2", "conv dilation 2 clip"])
def test_clang_builds_every_conv_path(case: str, tmp_path: Path) -> None:
    """The GEMM conv's im2col paths (padded rows and taps, groups, dilation, partial tiles and channel blocks)
    under clang's -Werror too."""
    if shutil.which("clang") is None:
        pytest.skip("clang is not installed (apt-get install clang)")
    actual, expected, manifest = build_and_run(lowered(case), tmp_path, compiler="clang")
    assert np.array_equal(actual, expected)
    assert manifest["kernels"]["c"] == "conv"


def test_cmake_builds_the_artifact(tmp_path: Path) -> None:
    if shutil.which("cmake") is None:
        pytest.skip("cmake is not installed")
    qgraph = lower(small_cnn(), image(200, (64,), seed=8) * 2)
    artifact = tmp_path / "artifact"
    artifact.mkdir()
    CTarget().export(qgraph, artifact)
    build = tmp_path / "build"
    flags = f"-DCMAKE_C_FLAGS={' '.join(STRICT)}"
    subprocess.run(["cmake", "-S", str(artifact), "-B", str(build), flags], check=True, capture_output=True)
    subprocess.run(["cmake", "--build", str(build)], check=True, capture_output=True)
    x_q = np.random.default_rng(23).integers(-128, 128, (50, 64)).astype(np.int8)
    x_q.tofile(tmp_path / "in.bin")
    subprocess.run([str(build / "model_test"), str(tmp_path / "in.bin"), str(tmp_path / "out.bin")], check=True)
    got = np.fromfile(tmp_path / "out.bin", dtype=np.int8).reshape(50, -1)
    assert np.array_equal(got, run_integer(qgraph, x_q))


def test_arena_beats_the_naive_sum_and_aliases_need_no_copy() -> None:
    qgraph = lower(small_cnn(), image(200, (64,), seed=8) * 2)
    rendered = render(qgraph, patching="off")   # layer by layer: every tensor a buffer (test_c_patch.py patches)
    arena = rendered.arena
    assert "image" not in rendered.kernels and "flat" not in rendered.kernels
    assert arena.peak_bytes < 0.6 * arena.naive_bytes
    model_c = rendered.files["model.c"]
    assert "int8_t bytes[MODEL_ARENA_BYTES];" in model_c
    assert f"peak {arena.peak_bytes} bytes, lower bound {arena.lower_bound_bytes}" in rendered.files["model.h"]
    # Buffers alive at the same step never share bytes.
    placements = list(arena.placements.values())
    for i, p in enumerate(placements):
        for q in placements[i + 1:]:
            assert not (p.overlaps_in_time(q) and p.overlaps_in_space(q.offset, q.size)), (p, q)


def test_a_layer_without_a_kernel_is_named(tmp_path: Path) -> None:
    rng = np.random.default_rng(9)
    graph = graph_of([Node("volume", "conv", ["x", "w"], ["y"], {})], (2, 3, 3, 3), {"w": rng.normal(size=(2, 2, 2, 2, 2))})
    qgraph = lower(graph, image(32, (2, 3, 3, 3)))
    with pytest.raises(BuildError, match=r"layer 'volume': the C target has no kernel for op 'conv'.*3-D"):
        CTarget().export(qgraph, tmp_path)


def test_a_3d_conv_is_refused_naming_layer_and_op(tmp_path: Path) -> None:
    graph = graph_of([conv_node("volume", "x", "y", pads=[1] * 6)], (2, 3, 4, 4),
                     {"volume_w": weights(3, 2, 3, 3, 3), "volume_b": weights(3)})
    qgraph = lower(graph, image(50, (2, 3, 4, 4)), default_config(graph, C_CAPABILITY))
    with pytest.raises(BuildError, match=r"layer 'volume': the C target has no kernel for op 'conv'.*3-D convolution"):
        CTarget().export(qgraph, tmp_path)


def test_ops_along_the_batch_axis_are_refused(tmp_path: Path) -> None:
    graph = graph_of([Node("fa", "dense", ["x", "wa"], ["a"], {}), Node("fb", "dense", ["x", "wb"], ["b"], {}),
                      Node("stack", "concat", ["a", "b"], ["y"], {"axis": 0})], (4,),
                     {"wa": weights(4, 3), "wb": weights(4, 3)})
    qgraph = lower(graph, image(32, (4,)))
    with pytest.raises(BuildError, match=r"layer 'stack': concat along the batch axis"):
        CTarget().export(qgraph, tmp_path)


@pytest.mark.parametrize("compiler, flags", [("cc", []), ("cc", ["-DDABUILD_NO_INCBIN"]), ("clang", [])])
def test_large_weights_leave_the_source_for_weights_bin(compiler: str, flags: list[str], tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the threshold the weights go to weights.bin (.incbin), or weights.inc's string literals without
    it; both bit-exact, and the C source no longer grows with the weights."""
    if shutil.which(compiler) is None:
        pytest.skip(f"{compiler} is not installed")
    monkeypatch.setattr("dabuild.targets.c.codegen.BLOB_THRESHOLD", 0)
    qgraph = lower(small_cnn(), image(200, (64,), seed=8) * 2)
    target = CTarget(CTarget.Options(compiler=compiler, cflags=[*STRICT, *flags]))
    artifact = tmp_path / "artifact"
    artifact.mkdir()
    target.export(qgraph, artifact)
    blob = (artifact / "weights.bin").read_bytes()
    assert len(blob) >= sum(layer.weight.size for layer in qgraph.layers if getattr(layer, "weight", None) is not None)
    assert "dabuild_weights + " in (artifact / "layer_pw.h").read_text()
    x_q = np.random.default_rng(22).integers(-128, 128, (40, 64)).astype(np.int8)
    assert np.array_equal(target.run(artifact, x_q, tmp_path), run_integer(qgraph, x_q))


@pytest.mark.parametrize("size", [0, 1, 31, 32, 33, 100])
def test_weights_inc_string_literals_spell_every_byte_a_line_of_32_at_a_time(size: int) -> None:
    from dabuild.targets.c.codegen import string_literal_lines

    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    lines = string_literal_lines(data).split("\n") if size else []
    assert len(lines) == -(-size // 32)
    assert all(re.fullmatch(r'    "(\\[0-7]{3}){1,32}"', line) for line in lines)
    assert bytes(int(escape, 8) for line in lines for escape in re.findall(r"\\([0-7]{3})", line)) == data


@pytest.mark.parametrize("case", sorted(CASES))
def test_native_integer_reference_equals_the_numpy_one(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """run_integer with the compiled conv and requantization against its pure numpy path, bit for bit."""
    from dabuild.ir.kernels import native

    qgraph = lowered(case)
    x_q = np.random.default_rng(23).integers(-128, 128, (SAMPLES, *qgraph.tensors[qgraph.input].shape)).astype(np.int8)
    monkeypatch.delenv(native.SWITCH, raising=False)
    assert native.native_conv() is not None
    compiled = run_integer(qgraph, x_q)
    monkeypatch.setenv(native.SWITCH, "0")
    np.testing.assert_array_equal(compiled, run_integer(qgraph, x_q))


def test_new_integer_layers_are_exact_end_to_end(tmp_path: Path) -> None:
    from test_onnx_target import DATA, new_ops_net

    graph = new_ops_net()
    qgraph = lower(graph, DATA["x_train"][:300], default_config(graph, C_CAPABILITY))
    actual, expected, manifest = build_and_run(qgraph, tmp_path)
    assert np.array_equal(actual, expected)
    assert {"indexed", "pick", "matmul", "lookup"} <= set(manifest["kernels"].values())
