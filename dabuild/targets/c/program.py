"""From a QGraph to the steps of model_forward: kernels chosen, storages assigned, buffers shared.

Layers run in the QGraph's schedule order. Each gets the first kernel whose
spec fits (`kernels.select`); its activation inputs are converted when the
kernel wants another storage (a conversion step, done once per tensor and
storage and shared by every reader), and its outputs get the storage the
kernel produces. Alias layers (reshape, flatten, ...) emit no step: their
output is their input's buffer; a transpose is one too, its output the
input's bytes in a renamed storage order. A float island's tensors (`QGraph.floats`)
are float32, canonical, without quantization params; the float constants its
layers read are the step's own (`Step.constants`), not int8 graph constants. The graph output must end canonical in `out`,
and the buffer it lives in becomes `out` itself, so the last kernel writes
there directly.

A clamp that is the only reader of an add's (or sub's) output, right after it
(a residual block's relu; `reference.absorbed_clamps`), is fused: the add's
step writes the clamp's output, clamped to its bounds, and the clamp takes no
step, as TFLM fuses the activation into ADD.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from dabuild.errors import BuildError
from dabuild.qir.layers.shape import QConcat, QSelection
from dabuild.qir.qgraph import QGraph, QLayer
from dabuild.qir.reference import absorbed_clamps
from dabuild.targets.c.kernels import KERNELS, Kernel, Operand, Step, select
from dabuild.targets.c.kernels.movement import conversion_storage
from dabuild.targets.c.kernels.registry import ALIAS, ANY, CANONICAL, CHANNELS_LAST, SAME, VIEW
from dabuild.targets.c.layout import Storage
from dabuild.targets.c.profiles import HOST, PROFILES, Profile
from dabuild.targets.c.streaming import Window

CONVERT = next(k for k in KERNELS.values() if k.op == ":convert")


@dataclass
class Program:
    steps: list[Step]
    storage: dict[str, Storage]   # every activation (and conversion) by name
    buffer: dict[str, str]        # tensor -> the buffer it lives in (an alias shares its input's)
    input: str                    # the buffer `in` is
    output: str                   # the buffer `out` is
    constants: dict[str, Operand]
    floats: frozenset[str] = frozenset()   # buffers of float32 values (4 bytes each)
    halves: frozenset[str] = frozenset()   # buffers of int16 values (2 bytes each: 16-bit activations)
    states: dict[str, tuple[Window, int]] = field(default_factory=dict)   # state buffers: window, frame offset

    def element_bytes(self, buffer: str) -> int:
        return 4 if buffer in self.floats else 2 if buffer in self.halves else 1


def _constant(qgraph: QGraph, name: str, rank: int, layer: QLayer) -> Operand:
    """A graph constant as a per-sample operand: leading axes of size 1 beyond the activation rank dropped."""
    shape = tuple(qgraph.constants[name].shape)
    while len(shape) > rank:
        if shape[0] != 1:
            raise BuildError(f"layer {layer.name!r}: constant {name!r} of shape {shape} varies along the batch "
                             "axis; the C model runs one sample at a time")
        shape = shape[1:]
    return Operand(name, Storage.canonical(shape), qgraph.tensors[name].params, constant=True)


def _touches_batch(layer: QLayer, rank: int) -> bool:
    """Whether a layer moves values across the batch axis (the C model sees one sample); `rank` counts it."""
    attrs = getattr(layer, "op_attrs", {})
    if isinstance(layer, QConcat):
        return layer.axis == 0
    if layer.op == "split":
        return attrs["axis"] % rank == 0
    if layer.op == "transpose":
        return attrs.get("perm") is None or attrs["perm"][0] != 0
    if layer.op == "slice":
        axes = attrs.get("axes")
        if axes is None:
            axes = list(range(len(attrs["starts"])))
        return 0 in [a % rank for a in axes]
    if layer.op == "pad":
        pads = attrs["pads"]
        return bool(pads[0] or pads[len(pads) // 2])
    return False


def build_program(qgraph: QGraph, profile: Profile = PROFILES[HOST], windows: Mapping[str, Window] | None = None) -> Program:
    """The steps of `qgraph`; a conv in `windows` (by layer name: a streaming call's, see streaming.py) reads its
    window, a state buffer outside the arena, into whose tail a copy step writes its input's new frames."""
    qgraph.require_dtypes("C", activations=("int8", "int16"))  # narrower types are exact in these
    storage = {qgraph.input: Storage.canonical(qgraph.tensors[qgraph.input].shape)}
    buffer = {qgraph.input: qgraph.input}
    steps: list[Step] = []
    converted: dict[tuple[str, str], str] = {}
    constants: dict[str, Operand] = {}
    states: dict[str, tuple[Window, int]] = {}

    params = {name: tensor.params for name, tensor in qgraph.tensors.items()}

    def operand(name: str) -> Operand:
        return Operand(name, storage[name], params.get(name))

    def shape(name: str) -> tuple[int, ...]:
        return qgraph.tensors[name].shape if name in qgraph.tensors else qgraph.floats[name]

    def in_storage(name: str, wanted: str) -> str:
        """`name`, or its conversion to the `wanted` storage (made once)."""
        current = storage[name]
        if wanted == ANY or (current.is_channels_last if wanted == CHANNELS_LAST else current.is_canonical):
            return name
        key = (name, wanted)
        if key not in converted:
            target = f"{name}@{wanted}"
            storage[target] = conversion_storage(current, wanted)
            buffer[target], params[target] = target, params[name]
            steps.append(Step(CONVERT, target, None, [operand(name)], [operand(target)]))
            converted[key] = target
        return converted[key]

    def window_operand(window: Window) -> Operand:
        """The conv's window, after a step copying the input's new frames into its tail."""
        whole, tail = f"{window.layer}:window", f"{window.layer}:window:new"
        storage[whole] = Storage.channels_last((window.channels, window.frames))
        storage[tail] = Storage.channels_last((window.channels, window.count))
        for name, offset in ((whole, 0), (tail, window.held)):
            buffer[name], params[name], states[name] = name, params[window.tensor], (window, offset)
        steps.append(Step(CONVERT, tail, None, [operand(window.tensor)], [operand(tail)]))
        return operand(whole)

    fused = absorbed_clamps(qgraph)
    for index, layer in enumerate(qgraph.layers):
        if index - 1 in fused:   # the clamp the add before it applies
            continue
        if _touches_batch(layer, len(shape(layer.inputs[0])) + 1):
            raise BuildError(f"layer {layer.name!r}: {layer.op} along the batch axis; the C model runs one sample "
                             "at a time")
        chosen: Kernel = select(layer, qgraph, profile)
        rank = len(shape(layer.outputs[0]))
        inputs = []
        float_constants = {}
        for name in layer.inputs:
            if name in qgraph.constants and name not in qgraph.tensors:
                float_constants[name] = qgraph.constants[name]
            elif name in qgraph.constants:
                constants[name] = _constant(qgraph, name, rank, layer)
                inputs.append(constants[name])
            elif windows and layer.name in windows:
                inputs.append(window_operand(windows[layer.name]))
            else:
                inputs.append(operand(in_storage(name, chosen.inputs)))
        outputs = []
        for name in fused.get(index, layer).outputs:
            if chosen.outputs == ALIAS:
                storage[name], buffer[name] = Storage.canonical(shape(name)), buffer[inputs[0].name]
                continue
            if chosen.outputs == VIEW:   # a transpose: the batch axis stays first (_touches_batch)
                assert isinstance(layer, QSelection)
                perm = tuple(axis - 1 for axis in layer.op_attrs["perm"][1:])
                storage[name], buffer[name] = inputs[0].storage.permuted(perm), buffer[inputs[0].name]
                continue
            storage[name], buffer[name] = _output_storage(chosen.outputs, shape(name), inputs), name
            outputs.append(operand(name))
        if outputs:
            steps.append(Step(chosen, layer.name, layer, inputs, outputs, profile, float_constants, qgraph.rounding,
                              fused.get(index)))

    output = in_storage(qgraph.output, CANONICAL)
    if buffer[output] == buffer[qgraph.input]:  # nothing but aliases of the input: `out` needs a copy
        if params[output] is not None and params[output].storage != "int8":
            raise BuildError(f"the C target copies an int8 input to its output, not {params[output].dtype}: the "
                             "graph only reshapes its 16-bit input")
        target = f"{qgraph.output}@out"
        storage[target], buffer[target], params[target] = storage[output], target, params[output]
        steps.append(Step(CONVERT, target, None, [operand(output)], [operand(target)]))
        output = target
    halves = frozenset(buffer[name] for name, quant in params.items()
                       if quant is not None and quant.storage == "int16" and name in buffer)
    return Program(steps, storage, buffer, buffer[qgraph.input], buffer[output], constants,
                   frozenset(buffer[name] for name in qgraph.floats), halves, states)


def _output_storage(rule: str, shape: tuple[int, ...], inputs: list[Operand]) -> Storage:
    if rule == CHANNELS_LAST:
        return Storage.channels_last(shape)
    if rule == SAME:
        for source in inputs:
            if source.shape == shape and not source.constant:
                return Storage(shape, source.storage.order)
    return Storage.canonical(shape)
