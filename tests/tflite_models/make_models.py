"""Makes the committed .tflite test models, once, with TensorFlow's converter (not needed by the test suite).

Run from the repository root with a TensorFlow venv (`.venv-tf`, ignored by git):

    python3 -m venv .venv-tf && .venv-tf/bin/pip install tensorflow-cpu
    .venv-tf/bin/python tests/tflite_models/make_models.py

Each Keras model below (seeded weights, so a rerun gives the same floats) is
converted three ways: float32, int8 (weights per channel, activations per
tensor, calibrated on seeded random data) and 16x8 (int16 activations, int8
weights, int64 biases; not the assorted model, whose HARD_SWISH TensorFlow's
16x8 quantizer refuses). int8 models of even index take and return int8, the
others float (the converter adds QUANTIZE and DEQUANTIZE). Inputs have a fixed batch of 1, as
TFLite Micro models do (a dynamic batch makes the converter compute reshapes at run time).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf

HERE = Path(__file__).parent
layers = tf.keras.layers


def ds_cnn() -> tf.keras.Model:
    """An MLPerf-Tiny-like DS-CNN (keyword spotting), narrowed: conv 10x4 stride 2, two depthwise-separable
    blocks with batch norm folded, average pool, dense, softmax."""
    x = inputs = tf.keras.Input((25, 10, 1), batch_size=1)
    x = layers.Conv2D(16, (10, 4), strides=2, padding="same")(x)
    x = layers.BatchNormalization()(x)
    x = layers.ReLU()(x)
    for _ in range(2):
        x = layers.DepthwiseConv2D((3, 3), padding="same")(x)
        x = layers.BatchNormalization()(x)
        x = layers.ReLU()(x)
        x = layers.Conv2D(16, 1)(x)
        x = layers.BatchNormalization()(x)
        x = layers.ReLU()(x)
    x = layers.AveragePooling2D(pool_size=x.shape[1:3])(x)
    x = layers.Reshape((16,))(x)
    x = layers.Dense(6)(x)
    return tf.keras.Model(inputs, layers.Softmax()(x), name="ds_cnn")


def resnet_block() -> tf.keras.Model:
    """A ResNet basic block with a strided projection shortcut, then max pool, global mean and dense."""
    x = inputs = tf.keras.Input((12, 12, 4), batch_size=1)
    y = layers.Conv2D(8, 3, strides=2, padding="same", activation="relu")(x)
    y = layers.Conv2D(8, 3, padding="same")(y)
    shortcut = layers.Conv2D(8, 1, strides=2)(x)
    x = layers.ReLU()(layers.Add()([y, shortcut]))
    x = layers.MaxPooling2D(2)(x)
    x = tf.keras.ops.mean(x, axis=[1, 2])
    return tf.keras.Model(inputs, layers.Dense(5)(x), name="resnet_block")


def assorted() -> tf.keras.Model:
    """The remaining ops: pad, transposed conv, strided slice, mul, concat, logistic, tanh, hard swish, reshape."""
    x = inputs = tf.keras.Input((8, 8, 3), batch_size=1)
    x = layers.ZeroPadding2D(((1, 0), (0, 1)))(x)
    x = layers.Conv2D(6, 3, activation="relu6")(x)
    up = layers.Conv2DTranspose(4, 2, strides=2)(x)
    up = up[:, 1:9:2, 0:8:2, :]
    gate = layers.Activation("sigmoid")(layers.Conv2D(4, 1)(up))
    x = layers.Multiply()([up, gate])
    x = layers.Concatenate()([x, layers.Activation("tanh")(up)])
    x = layers.Activation("hard_swish")(x)
    x = layers.Reshape((128,))(x)
    return tf.keras.Model(inputs, layers.Dense(4)(x), name="assorted")


def convert(model: tf.keras.Model, mode: str, integer_io: bool) -> bytes:
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    if mode != "float":
        shape = (64, *model.input_shape[1:])

        def representative() -> object:
            rng = np.random.default_rng(1)
            for sample in rng.normal(0, 1, shape).astype(np.float32):
                yield [sample[None]]

        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = representative
        if mode == "int8":
            converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
            if integer_io:
                converter.inference_input_type = converter.inference_output_type = tf.int8
        else:
            converter.target_spec.supported_ops = [
                tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8]
    return converter.convert()


def main() -> None:
    for index, build in enumerate((ds_cnn, resnet_block, assorted)):
        tf.keras.utils.set_random_seed(index)
        model = build()
        for variable in model.weights:  # batch norm statistics away from the identity, so folding matters
            if "moving_variance" in variable.name or "gamma" in variable.name:
                variable.assign(np.random.default_rng(index).uniform(0.5, 1.5, variable.shape))
            elif "moving_mean" in variable.name or "beta" in variable.name:
                variable.assign(np.random.default_rng(index).normal(0, 0.2, variable.shape))
        # TensorFlow's 16x8 quantizer takes no HARD_SWISH, so the assorted model has no 16x8 file
        for mode in ("float", "int8") if build is assorted else ("float", "int8", "16x8"):
            data = convert(model, mode, integer_io=index % 2 == 0)
            (HERE / f"{model.name}_{mode}.tflite").write_bytes(data)
            print(f"{model.name}_{mode}.tflite: {len(data)} bytes")


if __name__ == "__main__":
    main()
