"""The op set: kernels against straightforward references, shape rules with a dynamic batch, and the docs.

Conv and pooling are checked against naive loops over every output element on
tiny sizes; onnxruntime checks every op again in test_onnx_float.py.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest

from dabuild.errors import BuildError
from dabuild.ir import Graph, Node, TensorSpec
from dabuild.ir.interpreter import run, trace_layers
from dabuild.ir.ops import OPS, ShapeError

RNG = np.random.default_rng(2)


def normal(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def infer(op: str, shapes: list[tuple[int | None, ...]], **attrs: Any) -> list[tuple[int | None, ...]]:
    specs = [TensorSpec(f"i{n}", shape) for n, shape in enumerate(shapes)]
    return [shape for shape, _ in OPS[op].infer(specs, attrs)]


def kernel(op: str, *arrays: np.ndarray, **attrs: Any) -> np.ndarray:
    (result,) = OPS[op].run(list(arrays), attrs)
    return result


# ---------------------------------------------------------------- conv and pooling against loops


def naive_conv(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, strides: list[int], pads: list[int],
               dilations: list[int], groups: int) -> np.ndarray:
    """One output element at a time, straight from the definition (any number of spatial axes)."""
    spatial = x.ndim - 2
    padded = np.pad(x.astype(np.float64), [(0, 0), (0, 0), *[(pads[a], pads[a + spatial]) for a in range(spatial)]])
    kernel_shape = w.shape[2:]
    out = [(padded.shape[2 + a] - dilations[a] * (kernel_shape[a] - 1) - 1) // strides[a] + 1 for a in range(spatial)]
    per_group_in, per_group_out = w.shape[1], w.shape[0] // groups
    y = np.zeros((x.shape[0], w.shape[0], *out))
    for n, o, *position in itertools.product(range(x.shape[0]), range(w.shape[0]), *map(range, out)):
        group = o // per_group_out
        total = 0.0 if b is None else float(b[o])
        for c, *tap in itertools.product(range(per_group_in), *map(range, kernel_shape)):
            source = tuple(position[a] * strides[a] + tap[a] * dilations[a] for a in range(spatial))
            total += w[(o, c, *tap)] * padded[(n, group * per_group_in + c, *source)]
        y[(n, o, *position)] = total
    return y


CONV_CASES = {
    "plain": ((2, 3, 5, 5), (4, 3, 3, 3), {}),
    "strided_padded": ((1, 2, 7, 6), (3, 2, 3, 2), {"strides": [2, 3], "pads": [1, 0, 2, 1]}),
    "dilated": ((1, 2, 7, 7), (2, 2, 3, 3), {"dilations": [2, 3], "pads": [2, 2, 2, 2]}),
    "groups": ((2, 4, 5, 5), (6, 2, 3, 3), {"groups": 2, "pads": [1, 1, 1, 1]}),
    "depthwise": ((2, 3, 6, 6), (3, 1, 3, 3), {"groups": 3, "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "depthwise_multiplier": ((1, 2, 5, 5), (6, 1, 2, 2), {"groups": 2, "dilations": [2, 1]}),
    "conv1d": ((2, 3, 9), (2, 3, 3), {"strides": [2], "pads": [1, 2], "dilations": [2]}),
    "pointwise": ((3, 5, 2, 2), (4, 5, 1, 1), {}),
}


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("case", CONV_CASES.values(), ids=CONV_CASES.keys())
def test_conv_matches_the_definition(case: tuple[Any, ...], with_bias: bool) -> None:
    x_shape, w_shape, attrs = case
    x, w, b = normal(*x_shape), normal(*w_shape), normal(w_shape[0])
    spatial = len(x_shape) - 2
    expected = naive_conv(x, w, b if with_bias else None, attrs.get("strides", [1] * spatial),
                          attrs.get("pads", [0] * 2 * spatial), attrs.get("dilations", [1] * spatial),
                          attrs.get("groups", 1))
    arrays = [x, w, b] if with_bias else [x, w]
    y = kernel("conv", *arrays, **attrs)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)
    assert infer("conv", [(None, *x_shape[1:]), w_shape], **attrs) == [(None, *expected.shape[1:])]


def test_conv_blocks_of_images_give_the_same_result_as_one(monkeypatch: pytest.MonkeyPatch) -> None:
    from dabuild.ir.ops import linear

    x, w = normal(5, 3, 6, 6), normal(4, 3, 3, 3)
    whole = kernel("conv", x, w, pads=[1, 1, 1, 1])
    monkeypatch.setattr(linear, "COLUMN_BYTES", 1)  # one image per im2col block
    np.testing.assert_allclose(kernel("conv", x, w, pads=[1, 1, 1, 1]), whole, rtol=1e-6, atol=1e-6)


def naive_pool(x: np.ndarray, kernel_shape: list[int], strides: list[int], pads: list[int], dilations: list[int],
               ceil_mode: bool, kind: str, count_include_pad: bool = False) -> np.ndarray:
    """Loop over output positions; a window clipped to the input (max, avg) or to input + pads (avg incl. pad)."""
    spatial = x.ndim - 2
    sizes = x.shape[2:]
    out = []
    for a in range(spatial):
        room = sizes[a] + pads[a] + pads[a + spatial] - dilations[a] * (kernel_shape[a] - 1) - 1
        count = (math.ceil(room / strides[a]) if ceil_mode else room // strides[a]) + 1
        if ceil_mode and (count - 1) * strides[a] >= sizes[a] + pads[a]:
            count -= 1
        out.append(count)
    y = np.zeros((*x.shape[:2], *out), np.float64)
    for position in itertools.product(*map(range, out)):
        values, counted = [], 0
        for tap in itertools.product(*map(range, kernel_shape)):
            source = [position[a] * strides[a] + tap[a] * dilations[a] - pads[a] for a in range(spatial)]
            inside = all(0 <= source[a] < sizes[a] for a in range(spatial))
            in_padding = all(-pads[a] <= source[a] < sizes[a] + pads[a + spatial] for a in range(spatial))
            if inside:
                values.append(x[(slice(None), slice(None), *source)])
            counted += inside or (count_include_pad and in_padding)
        stacked = np.stack(values)
        y[(slice(None), slice(None), *position)] = stacked.max(0) if kind == "max" else stacked.sum(0) / counted
    return y


POOL_CASES = {
    "plain": ([2, 2], {}),
    "padded_strided": ([3, 3], {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "ceil": ([3, 2], {"strides": [2, 2], "ceil_mode": True}),
    "ceil_padded": ([3, 3], {"strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": True}),
    "asymmetric_pads": ([2, 3], {"strides": [1, 2], "pads": [0, 1, 1, 2]}),
}


@pytest.mark.parametrize("kind", ["max", "avg", "avg_incl_pad"])
@pytest.mark.parametrize("case", POOL_CASES.values(), ids=POOL_CASES.keys())
def test_pooling_matches_the_definition(case: tuple[list[int], dict[str, Any]], kind: str) -> None:
    kernel_shape, attrs = case
    x = normal(2, 3, 7, 8)
    attrs = dict(attrs)
    if kind == "avg_incl_pad":
        attrs["count_include_pad"] = True
    expected = naive_pool(x, kernel_shape, attrs.get("strides", kernel_shape), attrs.get("pads", [0] * 4), [1, 1],
                          attrs.get("ceil_mode", False), kind[:3], attrs.get("count_include_pad", False))
    op = "max_pool" if kind == "max" else "avg_pool"
    y = kernel(op, x, kernel=kernel_shape, **attrs)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)
    assert infer(op, [(None, 3, 7, 8)], kernel=kernel_shape, **attrs) == [(None, 3, *expected.shape[2:])]


def test_dilated_max_pool_and_1d_pooling() -> None:
    x = normal(2, 2, 9, 9)
    expected = naive_pool(x, [2, 3], [2, 1], [1, 0, 0, 1], [2, 2], False, "max")
    np.testing.assert_allclose(kernel("max_pool", x, kernel=[2, 3], strides=[2, 1], pads=[1, 0, 0, 1],
                                      dilations=[2, 2]), expected, rtol=1e-6)
    line = normal(2, 3, 10)
    np.testing.assert_allclose(kernel("avg_pool", line, kernel=[3], strides=[2]),
                               naive_pool(line, [3], [2], [0, 0], [1], False, "avg"), rtol=1e-5, atol=1e-6)


def test_global_avg_pool_keeps_rank() -> None:
    x = normal(2, 3, 4, 5)
    np.testing.assert_allclose(kernel("global_avg_pool", x), x.mean(axis=(2, 3), keepdims=True), rtol=1e-6)
    assert infer("global_avg_pool", [(None, 3, 4, 5)]) == [(None, 3, 1, 1)]
    assert infer("global_avg_pool", [(None, 3, 4)]) == [(None, 3, 1)]


# ---------------------------------------------------------------- elementwise, linear, normalisation


def erf(values: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf)(values.astype(np.float64))


ACTIVATIONS: dict[str, tuple[dict[str, Any], Any]] = {
    "relu": ({}, lambda x: np.maximum(x, 0)),
    "relu6": ({}, lambda x: np.minimum(np.maximum(x, 0), 6)),
    "leaky_relu": ({"alpha": 0.1}, lambda x: np.where(x >= 0, x, 0.1 * x)),
    "sigmoid": ({}, lambda x: 1 / (1 + np.exp(-x.astype(np.float64)))),
    "tanh": ({}, np.tanh),
    "hard_sigmoid": ({"alpha": 0.25, "beta": 0.4}, lambda x: np.clip(0.25 * x + 0.4, 0, 1)),
    "hard_swish": ({}, lambda x: x * np.clip(x + 3, 0, 6) / 6),
    "gelu": ({}, lambda x: 0.5 * x * (1 + erf(x / math.sqrt(2)))),
    "clip": ({"min": -1.0, "max": 2.0}, lambda x: np.clip(x, -1, 2)),
}


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_activation_kernels(name: str) -> None:
    attrs, reference = ACTIVATIONS[name]
    x = normal(3, 50) * 4
    x[0, :3] = [-80.0, 80.0, 0.0]  # far tails must not overflow
    y = kernel(name, x, **attrs)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, reference(x), rtol=1e-6, atol=2e-6)
    assert np.array_equal(x[0, :3], [-80.0, 80.0, 0.0])  # the input is left alone


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_fused_activation_equals_the_separate_op(name: str) -> None:
    attrs, _ = ACTIVATIONS[name]
    x, w, b = normal(4, 6), normal(6, 5), normal(5)
    fused = kernel("dense", x, w, b, activation=name, activation_attrs=attrs)
    np.testing.assert_array_equal(fused, kernel(name, kernel("dense", x, w, b), **attrs))
    image, filters = normal(2, 3, 5, 5), normal(4, 3, 3, 3)
    fused = kernel("conv", image, filters, activation=name, activation_attrs=attrs)
    np.testing.assert_array_equal(fused, kernel(name, kernel("conv", image, filters), **attrs))


def test_gelu_tanh_approximation_and_softmax() -> None:
    x = normal(3, 8)
    approx = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    np.testing.assert_allclose(kernel("gelu", x, approximate="tanh"), approx, rtol=1e-5, atol=1e-6)
    softmax = kernel("softmax", x * 100, axis=0)
    shifted = np.exp(x * 100 - (x * 100).max(axis=0))
    np.testing.assert_allclose(softmax, shifted / shifted.sum(axis=0), rtol=1e-5)


def test_binary_ops_broadcast() -> None:
    a, b = normal(2, 1, 4), RNG.uniform(0.5, 1, (3, 1)).astype(np.float32)
    for op, reference in (("add", np.add), ("sub", np.subtract), ("mul", np.multiply), ("div", np.divide)):
        np.testing.assert_allclose(kernel(op, a, b), reference(a, b), rtol=1e-6)
        assert infer(op, [(None, 1, 4), (3, 1)]) == [(None, 3, 4)]


def test_dense_matmul_and_batch_norm() -> None:
    x, w, b = normal(2, 3, 4), normal(4, 5), normal(5)
    np.testing.assert_allclose(kernel("dense", x, w, b), x @ w + b, rtol=1e-5)
    assert infer("dense", [(None, 3, 4), (4, 5), (5,)]) == [(None, 3, 5)]
    assert infer("matmul", [(None, 3, 4), (2, 1, 4, 5)]) == [(2, None, 3, 5)]
    image = normal(2, 3, 4, 4)
    scale, shift, mean, var = normal(3), normal(3), normal(3), RNG.uniform(0.5, 2, 3).astype(np.float32)
    expected = (image - mean[:, None, None]) / np.sqrt(var[:, None, None] + 1e-3) * scale[:, None, None]
    expected += shift[:, None, None]
    np.testing.assert_allclose(kernel("batch_norm", image, scale, shift, mean, var, epsilon=1e-3), expected,
                               rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- shape ops and reductions


def test_shape_ops_against_numpy() -> None:
    x = normal(2, 3, 4)
    np.testing.assert_array_equal(kernel("transpose", x, perm=[2, 0, 1]), x.transpose(2, 0, 1))
    np.testing.assert_array_equal(kernel("transpose", x), x.T)
    np.testing.assert_array_equal(kernel("concat", x, x[:, :1], axis=-2), np.concatenate([x, x[:, :1]], axis=1))
    parts = OPS["split"].run([x], {"axis": 2, "sizes": [1, 3]})
    np.testing.assert_array_equal(parts[1], x[:, :, 1:])
    np.testing.assert_array_equal(kernel("slice", x, starts=[-1, 3], ends=[-100, 0], axes=[1, 2], steps=[-1, -2]),
                                  x[:, ::-1, 3:0:-2])
    np.testing.assert_array_equal(kernel("slice", x, starts=[1], ends=[2**62]), x[1:])
    np.testing.assert_array_equal(kernel("pad", x, pads=[0, 1, 0, 0, 0, 2], mode="reflect"),
                                  np.pad(x, [(0, 0), (1, 0), (0, 2)], mode="reflect"))
    np.testing.assert_array_equal(kernel("pad", x, pads=[0, 0, 1, 0, 0, 1], value=7.0),
                                  np.pad(x, [(0, 0), (0, 0), (1, 1)], constant_values=7))
    np.testing.assert_array_equal(kernel("squeeze", x[:, :1, None]), x[:, 0])
    np.testing.assert_array_equal(kernel("unsqueeze", x, axes=[0, -1]), x[None, ..., None])
    np.testing.assert_array_equal(kernel("flatten", x, axis=2), x.reshape(6, 4))
    np.testing.assert_array_equal(kernel("reshape", x, shape=[0, -1]), x.reshape(2, 12))


@pytest.mark.parametrize("shape", [[0, 4, 3, 5, 6], [0, 3, 4, 5, 2, 3], [0, -1], [0, 12, 6, 5], [-1, 12, 5, 6],
                                   [0, 2, 6, 30], [24, 5, 6], [0, 12, 30]])
def test_reshape_of_channels_last_memory_gives_numpys_values(shape: list[int]) -> None:
    """A conv's output is (N, C, H, W) over channels-last memory: reshapes that regroup its channels keep
    that memory order (a view, or one copy), every other reshape is numpy's; the values are numpy's."""
    x = np.arange(2 * 5 * 6 * 12, dtype=np.float32).reshape(2, 5, 6, 12).transpose(0, 3, 1, 2)
    target = [x.shape[axis] if size == 0 else size for axis, size in enumerate(shape)]
    np.testing.assert_array_equal(kernel("reshape", x, shape=shape), x.reshape(target))


def test_channel_shuffle_of_a_conv_output_leaves_channels_last_memory() -> None:
    """ShuffleNet's reshape -> transpose -> reshape: the split is a view of the conv's memory, and the merge
    leaves channels-last memory (what the next conv reads without a copy)."""
    x = np.arange(2 * 5 * 6 * 12, dtype=np.float32).reshape(2, 5, 6, 12).transpose(0, 3, 1, 2)
    groups = kernel("reshape", x, shape=[0, 4, 3, 5, 6])
    assert np.shares_memory(groups, x)
    shuffled = kernel("reshape", kernel("transpose", groups, perm=[0, 2, 1, 3, 4]), shape=[0, 12, 5, 6])
    np.testing.assert_array_equal(shuffled, x.reshape(2, 4, 3, 5, 6).transpose(0, 2, 1, 3, 4).reshape(2, 12, 5, 6))
    assert shuffled.transpose(0, 2, 3, 1).flags.c_contiguous


@pytest.mark.parametrize(("op", "reference"), [("reduce_mean", np.mean), ("reduce_sum", np.sum),
                                               ("reduce_max", np.max)])
def test_reductions(op: str, reference: Any) -> None:
    x = normal(2, 3, 4)
    np.testing.assert_allclose(kernel(op, x, axes=[0, -1]), reference(x, axis=(0, 2), keepdims=True), rtol=1e-6)
    np.testing.assert_allclose(kernel(op, x, keepdims=False), reference(x), rtol=1e-5)
    assert infer(op, [(None, 3, 4)], axes=[-1], keepdims=False) == [(None, 3)]
    assert infer(op, [(None, 3, 4)]) == [(1, 1, 1)]


@pytest.mark.parametrize(
    ("op", "shapes", "attrs", "expected"),
    [
        ("concat", [(None, 3), (None, 2)], {"axis": 1}, [(None, 5)]),
        ("concat", [(None, 3), (2, 3)], {"axis": 0}, [(None, 3)]),
        ("split", [(None, 6)], {"axis": 1, "sizes": [2, 4]}, [(None, 2), (None, 4)]),
        ("slice", [(None, 10)], {"starts": [1], "ends": [-1], "axes": [1], "steps": [3]}, [(None, 3)]),
        ("slice", [(None, 10)], {"starts": [0], "ends": [1]}, [(None, 10)]),
        ("pad", [(None, 3)], {"pads": [0, 1, 0, 2]}, [(None, 6)]),
        ("squeeze", [(None, 1, 3, 1)], {}, [(None, 3)]),
        ("unsqueeze", [(None, 3)], {"axes": [1]}, [(None, 1, 3)]),
        ("transpose", [(None, 3, 4)], {"perm": [0, 2, 1]}, [(None, 4, 3)]),
        ("flatten", [(None, 3, 4)], {}, [(None, 12)]),
        ("max_pool", [(None, 3, 7)], {"kernel": [2], "strides": [1], "ceil_mode": True}, [(None, 3, 6)]),
    ],
)
def test_shape_rules_with_a_dynamic_batch(op: str, shapes: list[Any], attrs: dict[str, Any], expected: list[Any]) -> None:
    assert infer(op, shapes, **attrs) == expected


@pytest.mark.parametrize(
    ("op", "shapes", "attrs", "message"),
    [
        ("conv", [(None, 4, 5, 5), (2, 3, 3, 3)], {}, "input has 4 channels"),
        ("conv", [(None, 4, 5, 5), (3, 2, 3, 3)], {"groups": 2}, "groups 2 must divide the 3 output channels"),
        ("conv", [(None, 3, 5, 5), (2, 3, 3, 3)], {"strides": [1]}, "strides [1] must have 2 entries"),
        ("conv", [(None, 3, 2, 2), (2, 3, 3, 3)], {}, "does not fit"),
        ("conv", [(None, 3, 5, 5), (2, 3, 3, 3)], {"activation": "softmax"}, "activation 'softmax' is not one of"),
        ("dense", [(None, 3), (3, 2)], {"activation": "leaky_relu", "activation_attrs": {"beta": 1}},
         "leaky_relu has no attribute 'beta'"),
        ("relu", [(None, 3)], {"alpha": 0.1}, "relu has no attribute 'alpha' (attributes: none)"),
        ("reshape", [(None, 3)], {}, "reshape needs attribute 'shape'"),
        ("split", [(None, 6)], {"axis": 1, "sizes": [2, 2]}, "do not add up"),
        ("squeeze", [(None, 3)], {"axes": [1]}, "not all of size 1"),
        ("concat", [(None, 3), (None, 3, 1)], {"axis": 1}, "differ off axis"),
        ("transpose", [(None, 3)], {"perm": [0, 0]}, "not a permutation"),
        ("gelu", [(None, 3)], {"approximate": "erf"}, "approximate must be 'none' or 'tanh'"),
        ("pad", [(None, 3)], {"pads": [0, 3, 0, 3], "mode": "reflect"}, "smaller than the axes"),
        ("batch_norm", [(None, 3, 2), (4,), (3,), (3,), (3,)], {}, "scale must have shape (3,)"),
    ],
)
def test_shape_rules_reject_what_does_not_fit(op: str, shapes: list[Any], attrs: dict[str, Any], message: str) -> None:
    with pytest.raises(ShapeError) as error:
        infer(op, shapes, **attrs)
    assert message in str(error.value)


# ---------------------------------------------------------------- interpreter traces and docs


def test_trace_layers_returns_every_node_output_and_run_only_outputs() -> None:
    graph = Graph(
        inputs=[TensorSpec("x", (None, 3))],
        outputs=["y"],
        nodes=[Node("a", "relu", ["x"], ["h"]), Node("b", "split", ["h"], ["p", "q"], {"axis": 1, "sizes": [1, 2]}),
               Node("c", "mul", ["p", "q"], ["y"])],
        constants={},
    )
    x = normal(4, 3)
    trace = trace_layers(graph, {"x": x})
    assert list(trace) == ["h", "p", "q", "y"]
    np.testing.assert_array_equal(trace["y"], np.maximum(x[:, :1], 0) * np.maximum(x[:, 1:], 0))
    assert list(run(graph, {"x": x})) == ["y"]


def test_unknown_attribute_names_the_node() -> None:
    graph = Graph([TensorSpec("x", (None, 3))], ["y"], [Node("act", "leaky_relu", ["x"], ["y"], {"slope": 0.1})], {})
    with pytest.raises(BuildError, match=r"node 'act' \(leaky_relu\): leaky_relu has no attribute 'slope'"):
        graph.tensor_shapes()
