"""dabuild's integer reference: run a QGraph with the numpy kernels of its layers (`QLayer.run`).

They compute the same bits as the C kernels; intermediates are int64 (or
exact float64 sums) so numpy never wraps where C would not, and the lowering
guarantees the int32 accumulators of C cannot overflow. `check:<target>`
demands equality with this module for integer targets.
"""

from __future__ import annotations

from typing import Literal, overload

import numpy as np

from dabuild.qir.fixed_point import requantize
from dabuild.qir.layers.elementwise import QAdd, QClamp
from dabuild.qir.qgraph import QGraph

__all__ = ["dequantize_output", "quantize_input", "requantize", "run_integer", "run_quantized"]


@overload
def run_integer(qgraph: QGraph, x_q: np.ndarray, keep_intermediates: Literal[False] = False,
                accumulators: bool = True) -> np.ndarray: ...
@overload
def run_integer(qgraph: QGraph, x_q: np.ndarray, keep_intermediates: Literal[True],
                accumulators: bool = True) -> dict[str, np.ndarray]: ...
def run_integer(qgraph: QGraph, x_q: np.ndarray, keep_intermediates: bool = False,
                accumulators: bool = True) -> np.ndarray | dict[str, np.ndarray]:
    """Integer inputs (batch, *input shape) -> integer outputs, layer by layer in schedule order.

    Arrays are in their dtype's storage type (`QuantParams.storage`: int8 for int2..int8, ...). Without
    keep_intermediates, each tensor is dropped after its last reader.

    With keep_intermediates, every tensor by its name (the float graph's
    names, so traces line up with the float interpreter's) plus, with
    `accumulators`, each accumulating layer's int32 accumulator as
    `<layer>:accumulator` (which the compiled layers do not keep: tracing
    them runs the numpy code).
    """
    expected = qgraph.tensors[qgraph.input]
    x_q = np.asarray(x_q)
    if x_q.dtype != np.dtype(expected.params.storage) or x_q.shape[1:] != expected.shape:
        raise ValueError(f"run_integer: expected {expected.params.storage} inputs of shape (batch, "
                         f"{', '.join(map(str, expected.shape))}), got {x_q.dtype} {x_q.shape}")
    values: dict[str, np.ndarray] = {**qgraph.constants, qgraph.input: x_q}
    trace: dict[str, np.ndarray] | None = {} if keep_intermediates and accumulators else None
    last_reader = {name: index for index, layer in enumerate(qgraph.layers) for name in layer.inputs}
    fused = {} if keep_intermediates else absorbed_clamps(qgraph)
    for index, layer in enumerate(qgraph.layers):
        if index - 1 in fused:  # the clamp the add before it applied
            continue
        inputs = [values[name] for name in layer.inputs]
        if index in fused:
            assert isinstance(layer, QAdd)
            values.update(zip(fused[index].outputs, layer.run_clamped(inputs, qgraph, fused[index])))
        else:
            values.update(zip(layer.outputs, layer.run(inputs, qgraph, trace)))
        if not keep_intermediates:
            for name in layer.inputs:
                if last_reader[name] == index and name != qgraph.output and name not in qgraph.constants:
                    values.pop(name, None)
    if not keep_intermediates:
        return values[qgraph.output]
    return {**{name: value for name, value in values.items() if name not in qgraph.constants}, **(trace or {})}


def absorbed_clamps(qgraph: QGraph) -> dict[int, QClamp]:
    """Add and sub layers (by index) whose output only the clamp right after them reads (a residual block's
    relu): the add applies the clamp itself (`QAdd.run_clamped`, one table look-up for both), and the clamp
    does not run. Only where no intermediate is kept: a trace shows both tensors."""
    readers: dict[str, int] = {}
    for layer in qgraph.layers:
        for name in layer.inputs:
            readers[name] = readers.get(name, 0) + 1
    return {index: clamp for index, (layer, clamp) in enumerate(zip(qgraph.layers, qgraph.layers[1:]))
            if isinstance(layer, QAdd) and isinstance(clamp, QClamp) and len(layer.outputs) == 1
            and clamp.inputs == layer.outputs and readers[layer.outputs[0]] == 1 and layer.outputs[0] != qgraph.output}


def quantize_input(qgraph: QGraph, x: np.ndarray) -> np.ndarray:
    """The graph input's integers: real inputs quantized, integer indices (token ids) as they are."""
    if qgraph.takes_indices:
        return np.asarray(x).astype(qgraph.input_params.storage)
    return qgraph.input_params.quantize(x)


def dequantize_output(qgraph: QGraph, y_q: np.ndarray) -> np.ndarray:
    return qgraph.output_params.dequantize(y_q)


def run_quantized(qgraph: QGraph, x: np.ndarray) -> np.ndarray:
    """Float in, float out through the exact integer path: what a deployed integer model computes.

    Used to measure the accuracy a quantization config really delivers.
    """
    return dequantize_output(qgraph, run_integer(qgraph, quantize_input(qgraph, x)))
