"""The keras frontend: small Keras 3 models built here (torch backend), traced, run by dabuild's interpreter.

Every traced graph must compute what Keras computes (1e-4 relative to the
output's scale) on random inputs, as traced and after the canonical passes;
models round-trip through `.keras` files keras itself writes; layers dabuild
cannot map are all named in one error.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "torch")
keras = pytest.importorskip("keras")
from keras import layers  # noqa: E402

from dabuild.errors import UsageError  # noqa: E402
from dabuild.ir import Graph  # noqa: E402
from dabuild.ir.interpreter import run  # noqa: E402
from dabuild.ir.passes import optimize  # noqa: E402
from dabuild.trace import load_model, trace_model  # noqa: E402
from dabuild.trace.base import choose_framework  # noqa: E402

RTOL = 1e-4


def randomize(model: keras.Model, seed: int = 0) -> keras.Model:
    """Every weight random (batch-norm variances positive and away from 1), so no layer is an identity."""
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        shape, name = tuple(variable.shape), variable.name
        values = rng.uniform(0.5, 2.0, shape) if "variance" in name else rng.uniform(-0.5, 0.5, shape)
        variable.assign(values.astype(np.float32))
    return model


def assert_matches_keras(model: keras.Model, batch: int = 3) -> Graph:
    """Trace `model`; the raw and optimised graphs agree with model.predict on random inputs."""
    graph = trace_model(model)
    assert all(spec.shape[0] is None for spec in graph.inputs), "the batch axis must stay dynamic"
    rng = np.random.default_rng(1)
    feeds = {spec.name: rng.standard_normal((batch, *spec.shape[1:])).astype(np.float32) for spec in graph.inputs}
    expected = model.predict(list(feeds.values()) if len(feeds) > 1 else next(iter(feeds.values())), verbose=0)
    expected = expected if isinstance(expected, list) else [expected]
    for candidate in (graph, optimize(graph)):
        outputs = run(candidate, feeds)
        for name, want in zip(candidate.outputs, expected):
            got = outputs[name]
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=0, atol=RTOL * max(1.0, float(np.abs(want).max())))
    return graph


def sequential(input_shape: tuple[int, ...], *stack: keras.layers.Layer) -> keras.Model:
    return randomize(keras.Sequential([keras.Input(input_shape), *stack]))


LAYER_CASES = {
    "dense": ((12,), [layers.Dense(7, activation="relu"), layers.Dense(3, use_bias=False)]),
    "dense_rank3": ((5, 6), [layers.Dense(4, activation="tanh")]),
    "einsum_dense": ((5, 6), [layers.EinsumDense("abc,cde->abde", output_shape=(None, 2, 3), bias_axes="e")]),
    "conv1d": ((10, 3), [layers.Conv1D(4, 3, strides=2, padding="same", activation="sigmoid"),
                         layers.Conv1D(2, 2, padding="causal", dilation_rate=2)]),
    "conv2d": ((9, 9, 3), [layers.Conv2D(4, 3, strides=2, padding="same", activation="relu6"),
                           layers.Conv2D(4, (2, 3), dilation_rate=(1, 2), groups=2)]),
    "depthwise": ((8, 8, 3), [layers.DepthwiseConv2D(3, depth_multiplier=2, padding="same"),
                              layers.ReLU()]),
    "depthwise1d": ((9, 2), [layers.DepthwiseConv1D(3, strides=2, padding="same")]),
    "separable": ((8, 8, 3), [layers.SeparableConv2D(5, 3, depth_multiplier=2, strides=2, padding="same",
                                                     activation="leaky_relu")]),
    "separable1d": ((10, 3), [layers.SeparableConv1D(4, 3)]),
    "batch_norm": ((6, 6, 3), [layers.BatchNormalization(), layers.Flatten(), layers.BatchNormalization()]),
    "activations": ((4, 4, 2), [layers.Conv2D(3, 1), layers.ReLU(max_value=6.0), layers.LeakyReLU(0.1),
                                layers.Activation("hard_sigmoid"), layers.Activation("swish"),
                                layers.Activation("gelu"), layers.ReLU(max_value=2.5), layers.Softmax()]),
    "pooling": ((9, 9, 2), [layers.MaxPooling2D(3, strides=2, padding="same"), layers.AveragePooling2D(2),
                            layers.GlobalAveragePooling2D()]),
    "pooling_same_avg": ((7, 7, 2), [layers.AveragePooling2D(2, padding="same"),
                                     layers.GlobalMaxPooling2D(keepdims=True)]),
    "pooling1d": ((9, 3), [layers.MaxPooling1D(2), layers.AveragePooling1D(2, padding="same"),
                           layers.GlobalMaxPooling1D()]),
    "reshaping": ((4, 6, 2), [layers.Conv2D(3, 1), layers.Permute((2, 1, 3)), layers.Reshape((12, -1)),
                              layers.Dropout(0.5), layers.Flatten()]),
    "zero_padding": ((5, 5, 2), [layers.ZeroPadding2D(((1, 0), (2, 1))), layers.Conv2D(2, 3)]),
}


@pytest.mark.parametrize("case", sorted(LAYER_CASES))
def test_layers_match_keras(case: str) -> None:
    shape, stack = LAYER_CASES[case]
    assert_matches_keras(sequential(shape, *stack))


def _merging_model() -> keras.Model:
    image = keras.Input((6, 6, 3), name="image")
    extra = keras.Input((6, 6, 4), name="extra")
    a = layers.Conv2D(4, 3, padding="same")(image)
    b = layers.Conv2D(4, 1)(image)
    merged = [layers.Add()([a, b, extra]), layers.Subtract()([a, b]), layers.Multiply()([a, extra]),
              layers.Average()([a, b]), a * 0.5 + b - extra]
    joined = layers.Concatenate()(merged)
    side = layers.Concatenate(axis=1)([a, extra])
    return randomize(keras.Model([image, extra], [layers.GlobalAveragePooling2D()(joined), layers.Flatten()(side)]))


def test_merging_layers_and_several_inputs_and_outputs() -> None:
    graph = assert_matches_keras(_merging_model())
    assert [spec.name for spec in graph.inputs] == ["image", "extra"]


def test_nested_sequential_and_small_cnn() -> None:
    block = keras.Sequential([layers.Conv2D(4, 3, padding="same"), layers.BatchNormalization(), layers.ReLU()],
                             name="block")
    image = keras.Input((8, 8, 1))
    x = block(image)
    x = layers.MaxPooling2D()(x)
    x = layers.Conv2D(6, 3, activation="relu")(x)
    x = layers.Flatten()(x)
    model = randomize(keras.Model(image, layers.Dense(5, activation="softmax")(x)))
    graph = assert_matches_keras(model)
    assert sum(node.op == "transpose" for node in graph.nodes) == 2, "one transpose in, one before Flatten"


def test_jet_mlp_from_a_keras_file_saved_by_keras(tmp_path: Path) -> None:
    model = sequential((16,), layers.Dense(64, activation="relu"), layers.Dense(32, activation="relu"),
                       layers.Dense(32, activation="relu"), layers.Dense(5, activation="softmax"))
    path = tmp_path / "jet.keras"
    model.save(path)
    assert choose_framework(path) == "keras"
    assert choose_framework(model) == "keras", "a keras.Model is a torch Module too, but keras traces it"
    loaded = load_model(str(path), None)
    graph = trace_model(loaded)
    x = np.random.default_rng(2).standard_normal((4, 16)).astype(np.float32)
    np.testing.assert_allclose(run(graph, {graph.inputs[0].name: x})[graph.outputs[0]], model.predict(x, verbose=0),
                               atol=1e-5)


def test_factory_with_h5_weights(tmp_path: Path) -> None:
    (tmp_path / "model.py").write_text(
        "import keras\n"
        "def build():\n"
        "    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(3, activation='relu')])\n")
    source = sequential((6,), layers.Dense(3, activation="relu"))
    source.save_weights(tmp_path / "model.weights.h5")
    model = load_model(f"{tmp_path / 'model.py'}:build", tmp_path / "model.weights.h5")
    graph = trace_model(model)
    x = np.random.default_rng(3).standard_normal((2, 6)).astype(np.float32)
    np.testing.assert_allclose(run(graph, {graph.inputs[0].name: x})[graph.outputs[0]], source.predict(x, verbose=0),
                               atol=1e-5)
    unloaded = trace_model(load_model(f"{tmp_path / 'model.py'}:build", None), "keras")
    assert [n.op for n in unloaded.nodes] == [n.op for n in graph.nodes]
    assert not np.array_equal(*(next(v for k, v in g.constants.items() if "kernel" in k) for g in (graph, unloaded)))


def test_every_unsupported_layer_is_named_once() -> None:
    model = sequential((8, 3), layers.Conv1D(2, 3), layers.UpSampling1D(2), layers.Flatten(),
                       layers.Dense(4, activation="elu"), layers.Dense(2))
    with pytest.raises(UsageError) as error:
        trace_model(model)
    text = str(error.value)
    assert "2 layer(s) cannot be converted" in text
    assert "'up_sampling1d' (UpSampling1D): no converter for this layer class" in text
    assert "(Dense): activation 'elu'" in text
    assert "supported layers:" in text and "Conv2D" in text


def test_unsupported_options_are_named() -> None:
    model = sequential((6,), layers.ReLU(threshold=0.5))
    with pytest.raises(UsageError, match="threshold 0.5"):
        trace_model(model)
    with pytest.raises(UsageError, match="only equations contracting"):
        trace_model(sequential((4, 6), layers.EinsumDense("abc,bd->acd", output_shape=(6, 2))))


def test_declared_inputs_must_agree() -> None:
    model = randomize(keras.Sequential([keras.Input((16,), name="x"), layers.Dense(2)]))
    with pytest.raises(UsageError, match="has shape"):
        trace_model(model, "keras", {"x": [1, 8]})
    with pytest.raises(UsageError, match="does not take"):
        trace_model(model, "keras", {"y": [1, 16]})


def test_a_qkeras_file_names_the_package_it_needs(tmp_path: Path) -> None:
    """A QKeras model (tf.keras's .h5, its layers and quantizers by class name) cannot load without TensorFlow and
    QKeras: the error names them and the ways on (HGQ2's kbi quantizers, QONNX)."""
    h5py = pytest.importorskip("h5py")
    import json

    dense = {"class_name": "QDense", "config": {"name": "fc1", "units": 4, "kernel_quantizer": {
        "class_name": "quantized_bits", "config": {"bits": 6, "integer": 0, "keep_negative": 1}}}}
    relu = {"class_name": "QActivation", "config": {"name": "relu1", "activation": "quantized_relu(6)"}}
    config = {"class_name": "Sequential", "config": {"name": "qkeras_mlp", "layers": [
        {"class_name": "InputLayer", "config": {"batch_input_shape": [None, 8], "name": "x"}}, dense, relu]}}
    path = tmp_path / "qkeras_mlp.h5"
    with h5py.File(path, "w") as h5:
        h5.attrs["model_config"] = json.dumps(config)
        h5.attrs["keras_version"] = "2.15.0"
        h5.attrs["backend"] = "tensorflow"
        h5.create_group("model_weights")
    with pytest.raises(UsageError, match=r"qkeras_mlp.h5: a QKeras model \(layers QDense, quantized_bits, "
                                         r"QActivation\); QKeras needs TensorFlow \(package 'tensorflow'.*q_type 'kbi'"):
        trace_model(load_model(str(path), None))


def test_an_undeclared_emit_is_refused_while_converting() -> None:
    """A converter's `emits` feeds docs/ops.md; the Builder holds it to them, as the onnx and torch frontends do."""
    from dabuild.errors import BuildError
    from dabuild.trace.keras_frontend.walk import CONVERTERS, Converter

    model = sequential((4,), layers.ReLU())
    relu = CONVERTERS["ReLU"]
    with CONVERTERS.without("ReLU"):  # its real entry comes back on exit, replacing this one
        CONVERTERS.add("ReLU", Converter(relu.convert, ("sigmoid",)))
        with pytest.raises(BuildError, match="emits 'relu', which it does not declare"):
            trace_model(model)
