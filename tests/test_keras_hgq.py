"""HGQ2 models in the keras frontend: quantizers read as given quantization, equal to da4ml's own conversion.

The quantizer mapping is checked against HGQ2's own quantizers on random
inputs: the fixed_quant's float kernel and the integer layer it lowers to must
reproduce HGQ2's outputs bit for bit, for every rounding and overflow mode and
per-element types. Whole models (HGQ2's defaults: per element, RND, WRAP, with
QKeras-style `kbi` quantizers too) go through dabuild's given quantization to
the integer reference, which must equal Keras's predict bit for bit, and to
the hdl target's da4ml program, whose cost and latency must equal da4ml's own
conversion of the Keras model (hgq2's DAIS tracer plugin).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "torch")
keras = pytest.importorskip("keras")
pytest.importorskip("hgq")
from hgq.config import QuantizerConfig, QuantizerConfigScope  # noqa: E402
from hgq.layers import QConv2D, QDense, QMaxPool2D  # noqa: E402

from dabuild.capability import discover_capabilities  # noqa: E402
from dabuild.ir.given_quant import FixedQuant  # noqa: E402
from dabuild.ir.interpreter import run  # noqa: E402
from dabuild.ir.passes import optimize  # noqa: E402
from dabuild.progress import Progress  # noqa: E402
from dabuild.qir.layers.fake_quant import QFixedQuant  # noqa: E402
from dabuild.qir.qgraph import QGraph, QTensor, QuantParams  # noqa: E402
from dabuild.qir.reference import run_integer, run_quantized  # noqa: E402
from dabuild.quant.calibrate import calibrate  # noqa: E402
from dabuild.quant.given_params import fixed_params  # noqa: E402
from dabuild.quant.quantize import quantize  # noqa: E402
from dabuild.trace import trace_model  # noqa: E402
from dabuild.trace.keras_frontend.hgq import FixedQuantizer, Unsupported, weight_grid  # noqa: E402
from dabuild.tune.space import build_space  # noqa: E402

MODES = [("RND", "WRAP"), ("TRN", "SAT"), ("RND", "SAT_SYM"), ("RND_CONV", "WRAP"), ("TRN", "WRAP"),
         ("RND_INF", "SAT"), ("TRN_ZERO", "SAT")]


def random_types(shape: tuple[int, ...], seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 2, shape), rng.integers(-3, 5, shape), rng.integers(-2, 7, shape)


@pytest.mark.parametrize("round_mode, overflow_mode", MODES)
def test_fixed_quant_is_hgq2s_quantizer_bit_for_bit(round_mode: str, overflow_mode: str) -> None:
    """Per-element types, every mode: the float kernel on floats, the integer layer on integers."""
    from quantizers.fixed_point.fixed_point_ops_np import get_fixed_quantizer_np

    k, i, f = random_types((3, 4), 0)
    hgq2 = get_fixed_quantizer_np(round_mode, overflow_mode)
    fixed = FixedQuantizer(k, i, f, round_mode, overflow_mode).fixed("quantizer")
    x = (np.random.default_rng(1).standard_normal((400, 3, 4)) * 8).astype(np.float32)
    assert np.array_equal(fixed.quantize(x), hgq2(x, k, i, f))
    source = QuantParams(2.0**-10, 0, "int16")
    integers = source.quantize(x)
    target = fixed_params(fixed, "quantizer")
    graph = QGraph("x", "y", {"x": QTensor((3, 4), source), "y": QTensor((3, 4), target)}, [
        QFixedQuant(name="q", inputs=["x"], outputs=["y"], k=k.astype(np.int8), i=i.astype(np.int8),
                    f=f.astype(np.int8), rounding=fixed.rounding, overflow=fixed.overflow)])
    got = target.dequantize(run_integer(graph, integers))
    assert np.array_equal(got, hgq2(source.dequantize(integers), k, i, f))


def test_quantized_kernels_keep_their_integers() -> None:
    layer = QDense(8)
    layer.build((None, 16))
    kernel = keras.ops.convert_to_numpy(layer.qkernel)
    grid = weight_grid(kernel, "kernel")
    integers = kernel / grid["scale"][0]
    half = 2 ** (grid["bits"] - 1)
    assert np.array_equal(integers, np.rint(integers)) and -half <= integers.min() and integers.max() < half
    finer = weight_grid(kernel, "kernel", grid["scale"][0] / 8)
    assert finer["scale"][0] == grid["scale"][0] / 8 and finer["bits"] == grid["bits"] + 3


def test_what_dabuild_cannot_state_is_refused_with_the_nearest_choice() -> None:
    quantizer = FixedQuantizer(*random_types((6,), 2), "RND_MIN_INF", "WRAP")
    with pytest.raises(Unsupported, match="round_mode 'RND_MIN_INF'.*nearest choice: round_mode 'RND'"):
        quantizer.fixed("input quantizer")
    quantizer = FixedQuantizer(*random_types((6,), 2), "RND", "WRAP_SM")
    with pytest.raises(Unsupported, match="overflow_mode 'WRAP_SM'.*nearest choice: overflow_mode 'WRAP'"):
        quantizer.fixed("input quantizer")


def _randomized(model: keras.Model, seed: int) -> keras.Model:
    """Each activation quantizer's k, i, f (or k, b, i) set to random integers per element, as training leaves
    them (a freshly built HGQ2 layer has one type everywhere)."""
    rng = np.random.default_rng(seed)
    for layer in model.layers:
        quantizer = getattr(layer, "iq", None)
        inner = getattr(quantizer, "quantizer", None)
        if inner is None:
            continue
        for name, low, high in (("_i", 0, 3), ("_f", 1, 5), ("_b", 2, 7)):
            variable = getattr(inner, name, None)
            if variable is not None:
                variable.assign(rng.integers(low, high, tuple(variable.shape)).astype(np.float32))
    return model


def _mlp(kbi: bool = False) -> keras.Model:
    scope = QuantizerConfigScope(place="datalane", q_type="kbi") if kbi else QuantizerConfigScope()
    with scope:
        x = keras.Input((6,), name="x")
        h = QDense(12, activation="relu")(x)
        y = QDense(3, enable_oq=True)(h)
    return _randomized(keras.Model(x, y), 3)


def _cnn() -> keras.Model:
    image = keras.Input((6, 6, 1), name="x")
    h = QConv2D(3, 3, activation="relu")(image)
    h = QMaxPool2D(2)(h)
    h = keras.layers.Flatten()(h)
    return _randomized(keras.Model(image, QDense(4)(h)), 4)


def _given_qgraph(model: keras.Model, x: np.ndarray) -> QGraph:
    graph = optimize(trace_model(model))
    stats = calibrate(graph, [{"x": x}], Progress.silent())
    return quantize(graph, stats, build_space(graph, discover_capabilities()["da4ml"]).default())


@pytest.mark.parametrize("make", [_mlp, lambda: _mlp(kbi=True), _cnn], ids=["mlp", "mlp-kbi", "cnn"])
def test_hgq2_model_is_bit_exact_and_costs_what_da4mls_own_conversion_costs(make) -> None:
    pytest.importorskip("da4ml")
    from da4ml.converter import trace_model as da4ml_trace
    from da4ml.trace import HWConfig, comb_trace

    from dabuild.targets.hdl.program import trace

    model = make()
    shape = tuple(model.inputs[0].shape[1:])
    x = (np.random.default_rng(5).standard_normal((300, *shape)) * 3).astype(np.float32)
    expected = model.predict(x, verbose=0)
    graph = trace_model(model)
    assert any(node.op == "fixed_quant" for node in graph.nodes)
    np.testing.assert_allclose(run(graph, {"x": x})[graph.outputs[0]], expected, rtol=0, atol=1e-5)

    qgraph = _given_qgraph(model, x)
    assert np.array_equal(run_quantized(qgraph, x), expected), "the integer reference is HGQ2's quantized model"
    hwconf = HWConfig(1, -1, -1)
    ours, theirs = trace(qgraph, hwconf), comb_trace(*da4ml_trace(model, hwconf))
    assert (ours.cost, tuple(ours.latency)) == (theirs.cost, tuple(theirs.latency))
    integers = qgraph.input_params.quantize(x)
    logic = ours.predict(integers.reshape(len(x), -1).astype(np.float64) * qgraph.input_params.scale, n_threads=1)
    assert np.array_equal(np.asarray(logic).reshape(expected.shape), expected)


def test_qkeras_style_quantizers_are_fixed_point_types() -> None:
    """HGQ2's kbi quantizer (QKeras's quantized_bits: keep_negative, bits, integer) maps like kif; HGQ2's b counts
    the bits besides the sign (QKeras's bits=7, integer=2, keep_negative=1 is k=1, b=6, i=2: f = 4)."""
    with QuantizerConfigScope(place="datalane", q_type="kbi", overflow_mode="SAT", round_mode="RND",
                              heterogeneous_axis=(), homogeneous_axis=None):
        layer = QDense(4, iq_conf=QuantizerConfig(q_type="kbi", place="datalane", k0=1, b0=6, i0=2))
    layer.build((None, 5))
    fixed = FixedQuantizer.of(layer.iq, (5,), "input quantizer").fixed("input quantizer")
    assert isinstance(fixed, FixedQuant) and set(fixed.k) == {1} and set(fixed.f) == {4} and set(fixed.i) == {2}
    x = (np.random.default_rng(6).standard_normal((100, 5)) * 4).astype(np.float32)
    assert np.array_equal(fixed.quantize(x), keras.ops.convert_to_numpy(layer.iq(x, training=False)))
