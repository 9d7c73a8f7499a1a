"""Streaming 1-D conv models: one call per hop consumes the new frames and computes only the new output frames.

A 1-D model takes (channels, frames). Run on a stream, each conv over time
keeps the input frames its next outputs still need in a state buffer (its
window: the frames kept, then the frames of this call), so a call computes
only the new frames of every layer. Everything else a frame passes through
must work frame by frame (elementwise ops, batch norm, channel-wise ops, a
concat of channels), and the model may end in a head that sees one frame (a
flatten of a time axis of length 1, then dense layers): anything that mixes
frames (a pool or reduction over time, a flatten of several frames, a dense
over the time axis) or reads a frame that has not arrived yet (a conv padded
on the right) cannot stream, and `plan` names the first such layer.

What a call computes is defined on the stream x_0, x_1, ... (frames, one
`hop` of them per call after a reset): each tensor's frame j is what the
whole-window model computes for frame j of that tensor when run on the
frames from x_0 on, each conv's left padding being the zero point as in the
reference. A conv with less left padding than its kernel spans (valid
padding) delays its output: its frames get lower indices than its input's,
and the frames a call computes with negative indices are warm-up, never
read as data (a padded conv after it reads the zero point there, as the
reference pads). So after reset and T / hop calls on the window's T frames,
the frames with indices >= 0 the calls produced are exactly the whole-window
reference's output, and every later call's newest frame is the last output
frame of the reference on the sliding window of the T most recent frames.

The window bookkeeping: a conv of kernel span K = (k - 1) * d + 1, stride s
and left pad p, whose input's call-0 frames start at stream index b (n per
call, a multiple of s), keeps `held = p + m - s * floor((m + s - K + p) / s)`
frames (m = b mod s): K - 1 for a causal or a valid conv of stride 1. Its
output gets n / s frames per call from index floor((b + s - K + p) / s).

The analysis runs on plain `Op` records, so the same rules judge the float
graph before calibration (`CTarget.refuse`) and the QGraph at export.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dabuild.errors import UsageError

# Ops that work frame by frame: elementwise (a constant operand must not vary along time) or per channel.
PER_FRAME = frozenset({
    "relu", "relu6", "leaky_relu", "sigmoid", "tanh", "hard_sigmoid", "hard_swish", "elu", "selu", "softplus",
    "softsign", "abs", "neg", "exp", "log", "sqrt", "reciprocal", "pow", "erf", "gelu", "clip", "identity", "add",
    "sub", "mul", "div", "max", "min", "prelu", "where", "batch_norm", "fake_quant", "fixed_quant", "clamp",
    "lookup"})
# Ops that may end the time axis: allowed where it has one frame (the head then sees one frame per call).
HEAD_ENTRY = frozenset({"flatten", "reshape", "squeeze"})


class NotStreamable(UsageError):
    """A model streaming cannot run as asked: a layer that looks ahead or mixes frames, or a hop that does not
    fit; `option` is the target option the message is about."""

    option = "streaming"


@dataclass(frozen=True)
class Op:
    """A node or integer layer as the analysis sees it."""

    name: str
    op: str
    inputs: list[str]                       # activations
    constants: dict[str, tuple[int, ...]]   # constant operands and their shapes
    outputs: list[str]
    attrs: Mapping[str, Any]
    kernel: tuple[int, ...] | None = None   # a conv's kernel shape


@dataclass(frozen=True)
class Frames:
    """How a tensor with a time axis advances: `count` new frames per call, call 0's first at index `first`."""

    count: int
    first: int

    @property
    def warmup_calls(self) -> int:
        """Calls whose frames include some with a negative index."""
        return -(self.first // self.count) if self.first < 0 else 0


@dataclass(frozen=True)
class Window:
    """The state of one conv over time: its input's last `held` frames, then the call's `count` new ones, stored
    frame after frame (channels last)."""

    layer: str
    tensor: str        # the conv's input tensor
    channels: int
    held: int
    count: int
    first: int         # stream index of call 0's first new frame (negative: warm-up frames, filled as padding)

    @property
    def frames(self) -> int:
        return self.held + self.count

    @property
    def warmup_calls(self) -> int:
        """Calls whose new frames include some with a negative index."""
        return Frames(self.count, self.first).warmup_calls


@dataclass(frozen=True)
class Plan:
    """How a model streams at `hop` frames a call: every tensor's frames and every conv's window."""

    hop: int
    window_frames: int            # T: the whole-window model's input frames
    frames: dict[str, Frames]     # every tensor with a time axis
    windows: list[Window]
    output: Frames | None         # the output's frames; None: a head (one vector per frame, once ready)
    head_frames: Frames | None    # the frames the head follows (its one frame per call), for a head output
    reach: int = 1                # input frames one output frame depends on (its receptive field)

    @property
    def calls(self) -> int:
        """Calls of one whole window."""
        return self.window_frames // self.hop

    @property
    def output_frames(self) -> Frames:
        frames = self.output or self.head_frames
        assert frames is not None
        return frames

    @property
    def state_bytes(self) -> int:
        """The RAM of every window, kept between calls (static, outside the arena)."""
        return sum(window.frames * window.channels for window in self.windows)

    @property
    def warmup_calls(self) -> int:
        """Calls after a reset until every window's new frames and the output's have indices >= 0."""
        return max([window.warmup_calls for window in self.windows] + [self.output_frames.warmup_calls])

    def manifest(self) -> dict[str, Any]:
        """model.json's `streaming`: the hop, the calls of a window, and every state buffer (its RAM)."""
        return {"hop": self.hop, "calls_per_window": self.calls, "window_frames": self.window_frames,
                "receptive_field_frames": self.reach,
                "output_frames_per_call": self.output_frames.count, "warmup_calls": self.warmup_calls,
                "state_bytes": self.state_bytes,
                "states": [{"layer": window.layer, "channels": window.channels, "frames": window.frames,
                            "held_frames": window.held, "bytes": window.frames * window.channels}
                           for window in self.windows]}


def _int_list(value: Any, default: list[int]) -> list[int]:
    return [int(v) for v in value] if value else default


def plan(ops: list[Op], shapes: Mapping[str, tuple[int, ...]], model_input: str, model_output: str, hop: int,
         model: str) -> Plan:
    """The frames of every tensor and the window of every conv over time for `hop` input frames a call;
    NotStreamable naming the first layer (of `model`) that looks ahead or mixes frames."""
    shape = tuple(shapes[model_input])
    if len(shape) != 2:
        raise NotStreamable(f"streaming {model}: its input {model_input!r} has per-sample shape {list(shape)}; "
                            "streaming takes 1-D models, (channels, frames)")
    if hop < 1 or shape[1] % hop:
        raise NotStreamable(f"streaming {model}: hop {hop} does not divide the window of {shape[1]} frames of input "
                            f"{model_input!r}")
    frames: dict[str, Frames] = {model_input: Frames(hop, 0)}
    heads: list[Frames] = []
    windows: list[Window] = []
    for op in ops:
        if any(name in frames for name in op.inputs):
            try:
                _advance(op, frames, shapes, hop, windows, heads)
            except _Refused as refused:
                raise NotStreamable(f"streaming {model}: layer {op.name!r} ({op.op}) {refused}") from None
    output = frames.get(model_output)
    if output is None and not heads:
        raise NotStreamable(f"streaming {model}: its output {model_output!r} does not follow the input's frames")
    return Plan(hop, shape[1], frames, windows, output, heads[0] if heads else None, _reach(ops, frames))


def _reach(ops: list[Op], frames: Mapping[str, Frames]) -> int:
    """The input frames one output frame depends on (its receptive field): 1, and each conv over time adds its
    span less one, in its input's frames (strides before it widen them)."""
    reach: dict[str, tuple[int, int]] = {}   # tensor -> (input frames reached, input frames between its frames)
    widest = (1, 1)
    for op in ops:
        known = [reach.get(name, (1, 1)) for name in op.inputs if name in frames]
        if not known:
            continue
        span, step = max(known)
        if op.op == "conv" and op.kernel is not None and len(op.kernel) == 1:
            dilation = _int_list(op.attrs.get("dilations"), [1])[0]
            span, step = span + (op.kernel[0] - 1) * dilation * step, step * _int_list(op.attrs.get("strides"), [1])[0]
        reach.update((name, (span, step)) for name in op.outputs)
        widest = max(widest, (span, step))
    return widest[0]


class _Refused(Exception):
    """Why one layer cannot stream (plan names the layer)."""


def _advance(op: Op, frames: dict[str, Frames], shapes: Mapping[str, tuple[int, ...]], hop: int,
             windows: list[Window], heads: list[Frames]) -> None:
    """The frames of `op`'s outputs from its inputs' (and its window, for a conv over time that keeps state; the
    frames a head follows, for a layer that ends the time axis); _Refused where it looks ahead or mixes frames."""
    timed = [name for name in op.inputs if name in frames]
    if len(timed) != len(op.inputs):
        raise _Refused("mixes a tensor over time with one that has no time axis")
    first = frames[timed[0]]
    if any(frames[name] != first for name in timed):
        raise _Refused("combines tensors whose frames arrive at different calls (different delays or rates)")
    if op.op == "conv" and op.kernel is not None and len(op.kernel) == 1:
        frames[op.outputs[0]] = _conv_frames(op, first, shapes[timed[0]][0], hop, windows)
        return
    if op.op in PER_FRAME or (op.op == "concat" and _channel_axis(op.attrs.get("axis"))):
        varying = [name for name, dims in op.constants.items() if dims and dims[-1] != 1 and op.op != "batch_norm"]
        if varying:
            raise _Refused(f"reads constant {varying[0]!r} of shape {list(op.constants[varying[0]])}, which varies "
                           "along the time axis")
        frames.update((name, first) for name in op.outputs)
        return
    length = shapes[timed[0]][-1]
    if op.op in HEAD_ENTRY and length == 1:
        if first.count != 1:
            raise _Refused(f"ends the time axis, which takes one frame a call there, but gets {first.count} "
                           f"(hop {hop}); choose the hop the strides multiply to")
        if heads and heads[0] != first:
            raise _Refused("ends a time axis whose frames arrive at other calls than an earlier head's")
        heads.append(first)
        return
    if op.op in HEAD_ENTRY:
        raise _Refused(f"mixes the {length} frames of the time axis (a {op.op} of several frames); streaming needs a "
                       "model whose layers see one frame at a time outside its convs")
    raise _Refused("mixes frames of the time axis (it is no conv over time and does not work frame by frame); "
                   "streaming runs convs over time, elementwise and per-channel layers, and a head on one frame")


def _conv_frames(op: Op, first: Frames, channels: int, hop: int, windows: list[Window]) -> Frames:
    """The output frames of a conv over time, and its window (where it keeps frames between calls)."""
    assert op.kernel is not None
    stride = _int_list(op.attrs.get("strides"), [1])[0]
    dilation = _int_list(op.attrs.get("dilations"), [1])[0]
    left, right = _int_list(op.attrs.get("pads"), [0, 0])
    if right:
        plural = "s" if right > 1 else ""
        raise _Refused(f"pads {right} frame{plural} on the right of the time axis: its outputs look {right} "
                       f"frame{plural} ahead, which a stream has not received yet; pad on the left only (causal)")
    if first.count % stride:
        raise _Refused(f"has stride {stride}, which does not divide the {first.count} frames it gets per call "
                       f"(hop {hop}); choose a hop that the strides divide")
    span = (op.kernel[0] - 1) * dilation + 1
    offset = first.first % stride
    held = left + offset - stride * ((offset + stride - span + left) // stride)
    if held < 0:
        raise _Refused(f"has stride {stride} out of step with the frames it gets (the first at index {first.first}): "
                       "a conv before it delays them by an amount the stride does not divide")
    if held:   # else it reads just the call's frames (a pointwise conv): no state
        windows.append(Window(op.name, op.inputs[0], channels, held, first.count, first.first))
    return Frames(first.count // stride, (first.first + stride - span + left) // stride)


def _channel_axis(axis: Any) -> bool:
    """A concat axis (batch-first numbering, rank 3) that is the channel axis."""
    return axis in (1, -2)


def qgraph_ops(qgraph: Any) -> tuple[list[Op], dict[str, tuple[int, ...]]]:
    """The QGraph's layers as `Op`s, and every tensor's per-sample shape."""
    shapes = {name: tuple(tensor.shape) for name, tensor in qgraph.tensors.items()}
    shapes.update({name: tuple(shape) for name, shape in qgraph.floats.items()})
    ops = []
    for layer in qgraph.layers:
        constants = {name: tuple(qgraph.constants[name].shape) for name in layer.inputs if name in qgraph.constants}
        attrs = {**layer.attrs(), **getattr(layer, "op_attrs", {})}
        weight = getattr(layer, "weight", None)
        kernel = tuple(weight.shape[2:]) if layer.op == "conv" and weight is not None else None
        ops.append(Op(layer.name, layer.op, [name for name in layer.inputs if name not in constants], constants,
                      list(layer.outputs), attrs, kernel))
    return ops, shapes


def graph_ops(graph: Any) -> tuple[list[Op], dict[str, tuple[int, ...]]]:
    """The float graph's nodes as `Op`s, and every tensor's per-sample shape."""
    shapes = {name: tuple(spec.shape[1:]) for name, spec in graph.tensor_shapes().items()}
    ops = []
    for node in graph.nodes:
        constants = {name: tuple(graph.constants[name].shape) for name in node.inputs if name in graph.constants}
        kernel = tuple(graph.constants[node.inputs[1]].shape[2:]) \
            if node.op == "conv" and len(node.inputs) > 1 and node.inputs[1] in graph.constants else None
        ops.append(Op(node.name, node.op, [name for name in node.inputs if name and name not in constants],
                      constants, list(node.outputs), dict(node.attrs), kernel))
    return ops, shapes


def step_qgraph(qgraph: Any, streamed: Plan) -> Any:
    """The QGraph one call runs: every tensor over time `count` frames long, every conv over time unpadded (its
    window holds what the padding gave)."""
    tensors = {name: dataclasses.replace(tensor, shape=(*tensor.shape[:-1], streamed.frames[name].count))
               if name in streamed.frames else tensor for name, tensor in qgraph.tensors.items()}
    floats = {name: (*shape[:-1], streamed.frames[name].count) if name in streamed.frames else shape
              for name, shape in qgraph.floats.items()}
    windowed = {window.layer for window in streamed.windows}
    layers = [dataclasses.replace(layer, pads=[0, 0]) if layer.name in windowed else layer for layer in qgraph.layers]
    return dataclasses.replace(qgraph, tensors=tensors, layers=layers, floats=floats)


def plan_stream(qgraph: Any, hop: int) -> Plan:
    """The plan of the QGraph for `hop` frames a call (NotStreamable naming the first layer that cannot)."""
    ops, shapes = qgraph_ops(qgraph)
    streamed = plan(ops, shapes, qgraph.input, qgraph.output, hop, "the model")
    for window in streamed.windows:
        tensor = qgraph.tensors.get(window.tensor)
        dtype = "float32 (a float island's)" if tensor is None else tensor.params.dtype
        if tensor is None or tensor.params.storage != "int8":
            raise NotStreamable(f"streaming the model: conv {window.layer!r} reads {dtype} activations; streaming "
                                "keeps int8 state only")
    return streamed


def warmup_fill(program: Any, buffer: str, state_names: Mapping[str, str], qgraph: Any) -> dict[str, Any] | None:
    """What the step writing a window's new frames fills with the zero point while their indices are negative
    (the warm-up frames a padded conv must read as padding): None where no frame ever is."""
    if buffer not in program.states:
        return None
    window, frame = program.states[buffer]
    if window.first >= 0:
        return None
    return {"state": state_names[window.layer], "offset": frame * window.channels, "channels": window.channels,
            "count": window.count, "first": window.first,
            "zero_point": qgraph.tensors[window.tensor].params.zero_point}


def stream_context(streamed: Plan, program: Any, window_graph: Any, state_names: Mapping[str, str]) -> dict[str, Any]:
    """The template context of model_reset, model_step and the whole-window model_forward."""
    windows = []
    for window in streamed.windows:
        params = window_graph.tensors[window.tensor].params
        windows.append({"layer": window.layer, "ident": state_names[window.layer], "bytes": window.frames * window.channels,
                        "held_bytes": window.held * window.channels, "count_bytes": window.count * window.channels,
                        "zero_point": params.zero_point, "frames": window.frames, "held": window.held})
    shape = window_graph.tensors[window_graph.output].shape
    output = streamed.output_frames
    timed = streamed.output is not None
    return {"windows": windows, "hop": streamed.hop, "calls": streamed.calls, "window_frames": streamed.window_frames,
            "input_channels": window_graph.tensors[window_graph.input].shape[0],
            "output_channels": shape[0] if timed else int(window_graph.tensors[window_graph.output].size),
            "output_frames": shape[-1] if timed else 1, "output_count": output.count, "output_first": output.first,
            "warmup_calls": streamed.warmup_calls, "state_bytes": streamed.state_bytes, "reach": streamed.reach}

