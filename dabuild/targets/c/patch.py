"""Patch-based execution: a chain of convolutions run a band of output rows at a time.

MCUNetV2's observation: a CNN's first, high-resolution layers hold its largest
activations, so the peak RAM of a layer-by-layer schedule sits there. A
patched stage is a chain of consecutive 2-D conv steps (plain, depthwise,
pointwise), each reading only the one before it, whose intermediate tensors
never exist whole: the stage's last layer is computed one output row at a
time, and each layer before it computes, on demand, the rows the next one
needs for that, into a window of a few rows. A window keeps the rows it still
has to give (the overlap of 3x3 windows), so every row of every layer is
computed exactly once: no halo is recomputed, and the stage's MACs are those of
the layer-by-layer schedule. What it costs is a memmove per band of the rows a
window keeps, and a call per layer per band. Only the stage's input (read
where it lies) and its last output exist whole.

The same kernels run it: a `banded` step's forward function takes the output
rows [row_begin, row_end) to compute, writes them from its output pointer on,
and finds input row r at row r - in_first of its input pointer (the padded-row
ring of a depthwise conv and the band of conv_rows are set up per call).

The schedule is computed here, at export time, and emitted as a table of
literals: per band and layer, the rows it computes, where its input window
starts and the bytes its output window drops and keeps. Which chain is patched,
and whether any is, the arena planner decides (codegen.plan): the peak with
the stage patched against the layer-by-layer peak.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from dabuild.qir.layers.linear import QConv
from dabuild.targets.c.kernels import Step
from dabuild.targets.c.kernels.linear import window
from dabuild.targets.c.program import Program

BANDED_KERNELS = frozenset({"conv", "conv_mcu", "conv_rows", "conv_depthwise"})   # their templates take a band


@dataclass(frozen=True)
class Rows:
    """The row geometry of one banded conv: which input rows an output row reads, and the bytes of a row."""

    kernel: int
    stride: int
    dilation: int
    pad_top: int
    height: int          # input rows
    out_height: int
    in_row_bytes: int
    out_row_bytes: int
    macs_per_row: int    # multiply-accumulates of one output row

    def inputs(self, first: int, end: int) -> tuple[int, int]:
        """The input rows output rows [first, end) read (clipped to the input: the rest is padding)."""
        low = max(0, first * self.stride - self.pad_top)
        high = min(self.height, (end - 1) * self.stride - self.pad_top + (self.kernel - 1) * self.dilation + 1)
        return low, max(low, high)


def rows_of(step: Step) -> Rows:
    layer = step.layer
    assert isinstance(layer, QConv)
    geometry = window(step, list(layer.weight.shape[2:]), layer.strides, layer.pads, layer.dilations)
    taps = int(layer.weight[0].size)   # (C/groups) x kh x kw
    return Rows(geometry["kernel_height"], geometry["stride_height"], geometry["dilation_height"], geometry["pad_top"],
                geometry["height"], geometry["out_height"], geometry["width"] * geometry["channels"],
                geometry["out_width"] * geometry["out_channels"],
                geometry["out_width"] * geometry["out_channels"] * taps)


@dataclass(frozen=True)
class Call:
    """One layer's work in one band: output rows [begin, end); its input window holds rows from `in_first`; its
    output window first drops `drop` bytes (moving the `keep` bytes after them to its start), and the new rows go
    after the kept ones."""

    begin: int
    end: int
    in_first: int
    drop: int
    keep: int


@dataclass(frozen=True)
class Patch:
    first: int                            # index of its first step in the program
    steps: tuple[Step, ...]
    rows: tuple[Rows, ...]
    bands: tuple[tuple[Call, ...], ...]   # per band, one Call per step
    windows: tuple[int, ...]              # bytes of the window of each intermediate tensor (len(steps) - 1)

    @property
    def last(self) -> int:
        return self.first + len(self.steps) - 1

    @property
    def name(self) -> str:
        return f"patch:{self.steps[0].name}"

    @property
    def scratch_bytes(self) -> int:
        """The kernels run one after another and set their scratch up per call, so they share one."""
        return max(step.scratch_bytes for step in self.steps)

    def computed_rows(self) -> list[int]:
        """Output rows each layer computes over all bands (its height when nothing is recomputed)."""
        return [sum(band[index].end - band[index].begin for band in self.bands) for index in range(len(self.steps))]

    def recompute_macs(self) -> int:
        """MACs beyond the layer-by-layer schedule's: rows computed more than once (none, by construction; counted
        from the schedule all the same)."""
        return sum(max(0, count - rows.out_height) * rows.macs_per_row
                   for count, rows in zip(self.computed_rows(), self.rows))

    def moved_bytes(self) -> int:
        """Bytes the windows' memmoves copy per inference."""
        return sum(call.keep for band in self.bands for call in band[:-1] if call.drop)

    def report(self) -> dict[str, object]:
        last = self.rows[-1]
        return {"layers": [step.name for step in self.steps], "bands": len(self.bands),
                "tile": f"1 output row of {self.steps[-1].name} ({last.out_row_bytes} bytes)",
                "window_bytes": list(self.windows), "scratch_bytes": self.scratch_bytes,
                "recompute_macs": self.recompute_macs(), "moved_bytes": self.moved_bytes()}


def bandable(step: Step, program: Program) -> bool:
    """A 2-D int8 conv whose kernel takes a band of rows."""
    return (step.kernel.name in BANDED_KERNELS and isinstance(step.layer, QConv) and len(step.layer.strides) == 2
            and len(step.outputs) == 1 and step.clamp is None
            and all(program.buffer[operand.name] not in program.halves for operand in [*step.inputs, *step.outputs]))


def chains(program: Program) -> list[list[int]]:
    """Runs of consecutive bandable steps, each reading nothing but the output of the one before it, as that one
    stores it (a reshape between them would change what a row is), which no other step reads (step indices;
    runs of two or more)."""
    readers: dict[str, int] = {}
    for step in program.steps:
        for operand in step.inputs:
            if not operand.constant:
                buffer = program.buffer[operand.name]
                readers[buffer] = readers.get(buffer, 0) + 1

    def activations(step: Step) -> list[str]:
        return [program.buffer[o.name] for o in step.inputs if not o.constant]

    runs: list[list[int]] = []
    for index, step in enumerate(program.steps):
        if not bandable(step, program):
            continue
        before = program.steps[index - 1] if index else None
        linked = (runs and runs[-1][-1] == index - 1 and before is not None
                  and activations(step) == [program.buffer[before.outputs[0].name]]
                  and step.inputs[0].storage == before.outputs[0].storage   # no reshape between them
                  and readers[activations(step)[0]] == 1 and activations(step)[0] != program.output)
        if linked:
            runs[-1].append(index)
        else:
            runs.append([index])
    return [run for run in runs if len(run) >= 2]


def schedule(rows: list[Rows]) -> tuple[tuple[tuple[Call, ...], ...], tuple[int, ...]]:
    """Bands of one output row of the last layer; each layer computes, on demand, the rows its consumer needs
    that it has not computed yet. Returns the calls per band and each window's bytes."""
    count = len(rows)
    done = [0] * count             # rows computed so far, per layer
    low = [0] * count              # first row held in each layer's window
    largest = [0] * count
    bands = []
    for row in range(rows[-1].out_height):
        # backward: the rows each layer must compute, from the last layer's one row
        wanted: list[tuple[int, int]] = [(0, 0)] * count
        needed: list[tuple[int, int]] = [(0, 0)] * count   # rows of each layer's output the next layer reads
        wanted[-1] = (row, row + 1)
        for index in reversed(range(count)):
            first, end = wanted[index]
            if index and end > first:
                needed[index - 1] = rows[index].inputs(first, end)
                need_low, need_high = needed[index - 1]
                start = max(done[index - 1], need_low)
                wanted[index - 1] = (start, max(start, need_high))
        calls = []
        for index in range(count):
            first, end = wanted[index]
            drop = keep = 0
            if index < count - 1 and end > first:
                kept_low = max(needed[index][0], low[index])
                if kept_low < done[index]:   # rows held that the next layer reads again
                    drop = (kept_low - low[index]) * rows[index].out_row_bytes
                    keep = (done[index] - kept_low) * rows[index].out_row_bytes
                else:   # the window starts over at the new rows
                    kept_low = first
                low[index] = kept_low
                largest[index] = max(largest[index], end - kept_low)
            if end > first:
                done[index] = end
            in_first = low[index - 1] if index else 0
            calls.append(Call(first, end, in_first, drop, keep))
        bands.append(tuple(calls))
    return tuple(bands), tuple(largest[index] * rows[index].out_row_bytes for index in range(count - 1))


def patch(program: Program, indices: list[int]) -> Patch:
    """The patched stage of the steps at `indices` (a chain): copies of them, banded."""
    steps = tuple(dataclasses.replace(program.steps[index], banded=True) for index in indices)
    rows = [rows_of(step) for step in steps]
    bands, windows = schedule(rows)
    return Patch(indices[0], steps, tuple(rows), bands, windows)

