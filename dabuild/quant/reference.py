"""dabuild's integer reference: numpy kernels that compute the same bits as the C kernels.

Intermediates are int64 so numpy never wraps where C would not; the lowering
guarantees the int32 accumulator of C cannot overflow, so both agree exactly.
`check:<target>` demands equality with this module for integer targets.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dabuild.quant.qgraph import QDense, QGraph, QLayer, QRelu


def requantize(accumulator: np.ndarray, multiplier: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """round(acc * multiplier / 2**shift), ties away from zero, as the C `requantize` does.

    The magnitude is shifted and the sign put back, so C never right-shifts a
    negative number (implementation-defined in C99).
    """
    product = accumulator.astype(np.int64) * multiplier.astype(np.int64)
    shift = shift.astype(np.int64)
    rounded = (np.abs(product) + np.left_shift(np.int64(1), shift - 1)) >> shift
    return np.where(product < 0, -rounded, rounded)


def _dense(layer: QDense, x: np.ndarray, graph: QGraph, trace: dict[str, np.ndarray] | None) -> np.ndarray:
    source = graph.tensors[layer.inputs[0]].params
    target = graph.tensors[layer.outputs[0]].params
    centred = x.astype(np.int64) - source.zero_point
    accumulator = centred @ layer.weight.astype(np.int64) + layer.bias.astype(np.int64)
    if trace is not None:
        trace[f"{layer.name}:accumulator"] = accumulator.astype(np.int32)
    y = requantize(accumulator, layer.multiplier, layer.shift) + target.zero_point
    low = target.zero_point if layer.relu else target.qmin
    return np.clip(y, low, target.qmax).astype(target.dtype)


def _relu(layer: QRelu, x: np.ndarray, graph: QGraph, trace: dict[str, np.ndarray] | None) -> np.ndarray:
    return np.maximum(x, graph.tensors[layer.inputs[0]].params.zero_point).astype(x.dtype)


KERNELS: dict[str, Callable[..., np.ndarray]] = {"dense": _dense, "relu": _relu}


def run_integer(qgraph: QGraph, x_q: np.ndarray, keep_intermediates: bool = False) -> np.ndarray | dict[str, np.ndarray]:
    """int8 inputs (batch, *input shape) -> int8 outputs; with keep_intermediates, every tensor
    by name plus each dense layer's int32 accumulator as `<layer>:accumulator`."""
    expected = qgraph.tensors[qgraph.input]
    x_q = np.asarray(x_q)
    if x_q.dtype != np.dtype(expected.params.dtype) or x_q.shape[1:] != expected.shape:
        raise ValueError(f"run_integer: expected {expected.params.dtype} inputs of shape (batch, "
                         f"{', '.join(map(str, expected.shape))}), got {x_q.dtype} {x_q.shape}")
    values: dict[str, np.ndarray] = {qgraph.input: x_q}
    trace = values if keep_intermediates else None
    layer: QLayer
    for layer in qgraph.layers:
        values[layer.outputs[0]] = KERNELS[layer.op](layer, values[layer.inputs[0]], qgraph, trace)
    return values if keep_intermediates else values[qgraph.output]


def quantize_input(qgraph: QGraph, x: np.ndarray) -> np.ndarray:
    return qgraph.input_params.quantize(x)


def dequantize_output(qgraph: QGraph, y_q: np.ndarray) -> np.ndarray:
    return qgraph.output_params.dequantize(y_q)


def run_quantized(qgraph: QGraph, x: np.ndarray) -> np.ndarray:
    """Float in, float out through the exact integer path: what a deployed int8 model computes.

    Used to measure the accuracy a quantization config really delivers.
    """
    return dequantize_output(qgraph, run_integer(qgraph, quantize_input(qgraph, x)))
