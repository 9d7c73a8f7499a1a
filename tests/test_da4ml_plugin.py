"""dabuild as a da4ml frontend: da4ml's own `trace_model` on a quantized dabuild graph, bit-exact."""

from __future__ import annotations

import numpy as np
import pytest
from test_quantize import lower, mlp_graph

from dabuild.capability import load_capability
from dabuild.errors import BuildError
from dabuild.qir.qgraph import QGraph
from dabuild.qir.reference import run_integer
from dabuild.resources import data_dir

pytest.importorskip("da4ml")
from da4ml.converter import get_available_plugins, trace_model
from da4ml.trace import comb_trace

DA4ML = load_capability(data_dir("capabilities") / "da4ml.yaml")
C = load_capability(data_dir("capabilities") / "c.yaml")


def fixed_point_mlp(granularity: str = "per_tensor") -> QGraph:
    graph = mlp_graph([6, 10, 5, 3], ["relu", "relu", "none"], seed=5)
    x = np.random.default_rng(6).normal(size=(256, 6)).astype(np.float32)
    return lower(graph, x, granularity, capability=DA4ML)


def real_inputs(qgraph: QGraph, x_q: np.ndarray) -> np.ndarray:
    return x_q.astype(np.float64) * qgraph.input_params.scale


def test_the_plugin_is_registered_under_dabuild() -> None:
    assert get_available_plugins()["dabuild"].value == "dabuild.da4ml_plugin:DabuildDAISTracer"


@pytest.mark.parametrize("granularity", ["per_tensor", "per_channel"])
def test_trace_model_on_a_qgraph_computes_the_integer_reference(granularity: str) -> None:
    qgraph = fixed_point_mlp(granularity)
    inputs, outputs = trace_model(qgraph)  # framework found from the QGraph's module: "dabuild"
    comb = comb_trace(inputs, outputs)
    assert comb.shape == (6, 3) and comb.cost > 0
    x_q = np.random.default_rng(7).integers(-128, 128, (3000, 6)).astype(np.int8)  # saturates too
    expected = run_integer(qgraph, x_q)
    actual = comb.predict(real_inputs(qgraph, x_q)) / qgraph.output_params.scale
    assert np.array_equal(actual, expected)
    assert len(np.unique(expected)) > 20 and expected.min() < 0


def test_dump_gives_every_tensor_by_its_dabuild_name() -> None:
    qgraph = fixed_point_mlp()
    traces = trace_model(qgraph, dump=True)
    assert set(traces) == set(qgraph.tensors)
    assert traces["h1"].shape == qgraph.tensors["h1"].shape


def test_negative_ties_round_away_from_zero_as_dabuild_does() -> None:
    """One dense layer whose accumulators land on half steps: da4ml's RND alone would round -0.5 up to 0."""
    qgraph = fixed_point_mlp()
    last = qgraph.layers[-1]
    shift = int(np.log2(qgraph.output_params.scale / (last.params(qgraph).scale * last.weight_scale[0])))
    assert shift > 0  # the last layer drops bits, so ties exist
    inputs, outputs = trace_model(qgraph)
    comb = comb_trace(inputs, outputs)
    x_q = np.random.default_rng(8).integers(-128, 128, (20000, 6)).astype(np.int8)
    trace = run_integer(qgraph, x_q, keep_intermediates=True)
    accumulator = trace[f"{last.name}:accumulator"].astype(np.int64)
    negative_ties = (accumulator < 0) & (accumulator % (1 << shift) == 1 << (shift - 1))
    assert negative_ties.any()
    actual = comb.predict(real_inputs(qgraph, x_q)) / qgraph.output_params.scale
    assert np.array_equal(actual, trace[qgraph.output])


def test_arbitrary_scales_are_refused_with_the_layer_named() -> None:
    graph = mlp_graph([6, 4], ["relu"], seed=5)
    qgraph = lower(graph, np.random.default_rng(6).normal(size=(64, 6)).astype(np.float32), capability=C)
    with pytest.raises(BuildError, match="power-of-two scales.*'pot'"):
        trace_model(qgraph)
