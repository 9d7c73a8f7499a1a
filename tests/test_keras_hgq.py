"""HGQ2 models in the keras frontend: quantizers read as given quantization, refused where it cannot state them.

The quantizer mapping is checked against HGQ2's own quantizers on random
inputs: the fake_quant attributes, run by the formula of dabuild's given
quantization, must reproduce HGQ2's outputs bit for bit. Whole models need
the given-quantization IR (op fake_quant); those tests run where it exists.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "torch")
keras = pytest.importorskip("keras")
pytest.importorskip("hgq")
from hgq.config import QuantizerConfigScope  # noqa: E402
from hgq.layers import QConv2D, QDense, QMaxPool2D  # noqa: E402

from dabuild.errors import UsageError  # noqa: E402
from dabuild.ir.interpreter import run  # noqa: E402
from dabuild.ir.ops import OPS  # noqa: E402
from dabuild.ir.passes import optimize  # noqa: E402
from dabuild.trace import trace_model  # noqa: E402
from dabuild.trace.keras_frontend.hgq import FixedQuantizer, Unsupported, weight_grid  # noqa: E402

needs_given = pytest.mark.skipif("fake_quant" not in OPS, reason="needs dabuild's given quantization (fake_quant)")


def per_tensor(**modes: str) -> QuantizerConfigScope:
    """HGQ2 quantizers with one type per tensor, saturating and rounding half to even unless `modes` say else."""
    config = {"overflow_mode": "SAT", "round_mode": "RND_CONV", "heterogeneous_axis": (), "homogeneous_axis": None}
    return QuantizerConfigScope(place="datalane", **{**config, **modes})


def given_formula(x: np.ndarray, attrs: dict) -> np.ndarray:
    """dabuild.ir.given's fake_quant, written out: (clip(round(x / scale), qmin, qmax)) * scale."""
    scale, bits = attrs["scale"][0], attrs["bits"]
    low, high = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if attrs["signed"] else (0, 2**bits - 1)
    if attrs["narrow"]:
        low = -high
    rounding = {"half_even": np.round, "floor": np.floor}[attrs["rounding"]]
    return np.clip(rounding(np.asarray(x, np.float64) / scale), low, high) * scale


@pytest.mark.parametrize("modes", [{}, {"round_mode": "TRN"}, {"overflow_mode": "SAT_SYM"}])
def test_per_tensor_quantizers_are_given_quantization_bit_for_bit(modes: dict) -> None:
    with per_tensor(**modes):
        layer = QDense(4)
    layer.build((None, 6))
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((200, 6)) * 2.0 ** rng.integers(-3, 6, (200, 6))).astype(np.float32)
    quantizer = FixedQuantizer.of(layer.iq, (6,), "input quantizer")
    expected = keras.ops.convert_to_numpy(layer.iq(x, training=False))
    assert np.array_equal(quantizer.quantize(x), expected)
    assert np.array_equal(given_formula(x, quantizer.given("input quantizer")), expected)


def test_quantized_kernels_keep_their_integers() -> None:
    with per_tensor():
        layer = QDense(8)
    layer.build((None, 16))
    kernel = keras.ops.convert_to_numpy(layer.qkernel)
    grid = weight_grid(kernel, "kernel")
    assert np.array_equal(given_formula(kernel, grid), kernel)
    coarser = {**grid, "scale": [grid["scale"][0] * 2]}
    assert not np.array_equal(given_formula(kernel, coarser), kernel), "the grid is the coarsest that holds them"


def test_what_given_quantization_cannot_state_is_refused_with_the_nearest_choice() -> None:
    layer = QDense(4)  # HGQ2's defaults for activations: per element, WRAP, RND
    layer.build((None, 6))
    with pytest.raises(Unsupported, match="round_mode 'RND'.*nearest choice: round_mode 'RND_CONV'"):
        FixedQuantizer.of(layer.iq, (6,), "input quantizer").given("input quantizer")
    with per_tensor(overflow_mode="WRAP"):
        wrapping = QDense(4)
    wrapping.build((None, 6))
    with pytest.raises(Unsupported, match="overflow_mode 'WRAP'.*nearest choice: overflow_mode 'SAT'"):
        FixedQuantizer.of(wrapping.iq, (6,), "input quantizer").given("input quantizer")
    quantizer = FixedQuantizer.of(layer.iq, (6,), "input quantizer")
    varied = FixedQuantizer(quantizer.k, quantizer.i, np.arange(6), "RND_CONV", "SAT")
    with pytest.raises(Unsupported, match="per-element bit widths .6 distinct.*heterogeneous_axis=\\(\\)"):
        varied.given("input quantizer")


def _hgq_cnn() -> keras.Model:
    with per_tensor():
        image = keras.Input((8, 8, 1), name="x")
        x = QConv2D(4, 3, activation="relu")(image)
        x = QMaxPool2D(2)(x)
        x = keras.layers.Flatten()(x)
        x = QDense(5)(x)
    return keras.Model(image, x)


def test_an_hgq_model_is_refused_by_layer_and_quantizer() -> None:
    model = keras.Sequential([keras.Input((6,)), QDense(4, activation="relu"), QDense(3)])
    with pytest.raises(UsageError) as error:
        trace_model(model)
    text = str(error.value)
    if "fake_quant" in OPS:
        assert "2 layer(s) cannot be converted" in text and "input quantizer: round_mode 'RND'" in text
    else:
        assert "(QDense): HGQ2 quantizers need dabuild's given quantization" in text


@needs_given
def test_hgq_cnn_traces_to_what_hgq_computes() -> None:
    model = _hgq_cnn()
    graph = trace_model(model)
    quantizers = sum(bool(getattr(layer, "enable_iq", False)) + hasattr(layer, "qkernel") for layer in model.layers)
    assert sum(node.op == "fake_quant" for node in graph.nodes) == quantizers == 5  # conv, pool, dense iq; 2 kernels
    x = np.random.default_rng(1).uniform(0, 4, (16, 8, 8, 1)).astype(np.float32)
    expected = model.predict(x, verbose=0)
    for candidate in (graph, optimize(graph)):
        np.testing.assert_allclose(run(candidate, {"x": x})[candidate.outputs[0]], expected, rtol=0, atol=1e-5)
