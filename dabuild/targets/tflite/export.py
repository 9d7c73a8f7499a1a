"""The .tflite file of a QGraph: each layer through its writer, every layer no writer can take listed at once."""

from __future__ import annotations

from dataclasses import dataclass

from dabuild.errors import BuildError, UsageError
from dabuild.qir.qgraph import INDICES, QGraph
from dabuild.targets.tflite.flatfile import NHWC, PLAIN, FlatFile
from dabuild.targets.tflite.writers import write_layer


@dataclass(frozen=True)
class Written:
    """The packed model, and where each QGraph tensor's values lie in it: name -> [file tensor, layout] (a
    tensor whose file tensor a fused clamp changed after it is left out: the file never holds its values;
    "n1wc": a rank-3 tensor channels last under a unit height)."""

    data: bytes
    tensors: dict[str, list[int | str]]


def manifest_layout(layout: str, rank: int) -> str:
    """The layout model.json names: "n1wc" for a rank-3 tensor channels last, whose axes `trace` must drop a
    unit height from as well as reorder."""
    return "n1wc" if layout == NHWC and rank == 3 else layout


def to_tflite(qgraph: QGraph, float_io: bool = False) -> Written:
    """The model as written (`float_io`: taking and returning float32, a QUANTIZE after the input and a
    DEQUANTIZE before the output, as TensorFlow's converter writes by default); UsageError listing every layer
    the tflite target cannot write (its op, or what of it TFLite has no form for), so one run tells the user all
    of it."""
    refused: list[str] = []
    for name in {name for layer in qgraph.layers for name in (*layer.inputs, *layer.outputs)} | {qgraph.input}:
        params = qgraph.tensors[name].params if name in qgraph.tensors else None
        if params is not None and (params == INDICES or params.dtype not in ("int8", "int16")):
            refused.append(f"tensor {name!r} is {'integer indices' if params == INDICES else params.dtype}; TFLite "
                           "activations here are int8 or int16")
    if refused:
        raise UsageError("the tflite target cannot write this model:\n" + "\n".join(f"  {line}" for line in refused))
    file = FlatFile(qgraph, float_io=float_io)
    file.place(qgraph.input, file.activation(qgraph.input, PLAIN), PLAIN)
    if float_io:
        file.operator("QUANTIZE", [file.float_tensor(qgraph.input)], [file.value(qgraph.input, PLAIN)],
                      "QuantizeOptions")
    for layer in qgraph.layers:
        try:
            write_layer(file, layer)
        except BuildError as error:
            refused.append(str(error))
            for name in layer.outputs:   # stand-ins, so the layers after it are checked too
                file.place(name, file.activation(name, PLAIN), PLAIN)
    if refused:
        raise UsageError("the tflite target cannot write these layers:\n" + "\n".join(f"  {line}" for line in refused))
    data = file.finish()
    tensors: dict[str, list[int | str]] = {name: [placed[0].index, manifest_layout(placed[0].layout, file.rank(name))]
                                           for name, placed in file.placed.items() if name not in file.clamped
                                           and placed and name not in qgraph.constants}
    return Written(data, tensors)
