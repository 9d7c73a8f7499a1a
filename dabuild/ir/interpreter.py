"""Reference execution of a Graph with the numpy kernels of the op registry.

This is dabuild's float ground truth: calibration observes it, tuning scores
against it, and targets are checked against what it (or its integer twin) says.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from threadpoolctl import ThreadpoolController

from dabuild.errors import UsageError
from dabuild.ir.graph import Graph, TensorSpec
from dabuild.ir.kernels.forking import forget_pool_after_fork
from dabuild.ir.kernels.native import layer_threads
from dabuild.ir.movement import MOVES, FusedMovement
from dabuild.ir.ops import OPS, Activation
from dabuild.ir.ops.base import Kernel
from dabuild.ir.ops.linear import Conv


def _shape_text(shape: tuple[int | None, ...]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def _fits(spec: TensorSpec, shape: tuple[int, ...]) -> bool:
    return len(shape) == len(spec.shape) and all(
        want is None or want == got for want, got in zip(spec.shape, shape)
    )


def validate_feeds(graph: Graph, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Feeds as arrays of each input's dtype; UsageError naming any wrong, missing or misshaped input."""
    names = {spec.name for spec in graph.inputs}
    unknown = sorted(set(feeds) - names)
    if unknown:
        expected = ", ".join(f"{spec.name} {_shape_text(spec.shape)}" for spec in graph.inputs)
        raise UsageError(f"unknown graph input {', '.join(map(repr, unknown))}; the graph takes {expected}")
    arrays: dict[str, np.ndarray] = {}
    for spec in graph.inputs:
        if spec.name not in feeds:
            raise UsageError(f"missing graph input {spec.name!r} (expected shape {_shape_text(spec.shape)})")
        array = np.asarray(feeds[spec.name], dtype=spec.dtype)
        if not _fits(spec, array.shape):
            raise UsageError(
                f"graph input {spec.name!r} has shape {_shape_text(array.shape)}; "
                f"expected {_shape_text(spec.shape)} (? = any size)"
            )
        arrays[spec.name] = array
    return arrays


Visitor = Callable[[str, np.ndarray], None]


@dataclass
class Step:
    """One step of a plan: a prepared kernel, where its arrays come from and go, and what dies after it."""

    kernel: Kernel
    inputs: list[str]
    outputs: list[str]
    finished: list[str] = field(default_factory=list)  # tensors nothing later reads (outputs, constants excluded)
    overwritable: list[int] = field(default_factory=list)  # positions of finished inputs the output may go into


class Interpreter:
    """A graph prepared once for many batches: attributes resolved, kernels bound, tensor lifetimes known.

    Without `keep_intermediates`, each intermediate is dropped after its last
    reader, and an op that can (add, relu, conv, ...) writes its output into an
    input that dies with it when nothing else refers to that memory, so a
    residual block does not allocate (and page-fault in) a fresh tensor per op.
    A residual block's conv -> add -> activation also runs as one step (see
    `Conv.prepare_residual`); with `keep_intermediates` every node runs alone,
    since the per-layer trace needs the tensors in between.

    With `threads` > 1, a batch of a graph whose nodes all treat samples
    independently and that has convs runs as that many slices at once, each on
    its own thread with single-threaded BLAS (numpy releases the GIL in its
    loops): images are independent, so every node's work splits evenly, where
    threaded BLAS splits only the matmuls, each small one with its own
    synchronisation. The slices compute exactly what the whole batch computes.
    Graphs of dense layers only run serially (too little work per call to pay
    for the dispatch). A batch too small to split (one image, say) instead
    splits the output rows of each large native conv among the threads
    (`dabuild.ir.kernels.native.layer_threads`).
    The graph must not change while an Interpreter of it is in use.
    """

    def __init__(self, graph: Graph, threads: int = 1):
        self.graph = graph
        self.threads = threads
        self.steps = _plan(graph, _fusions(graph), fuse_movement=True)
        self.separate_steps = _plan(graph, {})
        self.splits = threads > 1 and _splittable(graph)
        self._pool: ThreadPoolExecutor | None = None
        forget_pool_after_fork(self)
        self.single = _fixed_single(graph)

    def run(self, feeds: dict[str, np.ndarray], keep_intermediates: bool = False,
            visit: Visitor | None = None) -> dict[str, np.ndarray]:
        """The graph outputs by name; with `keep_intermediates`, every input and node output as well.

        `visit(name, array)` sees each graph input and then every node output as soon as it is computed
        (nodes run one by one, unfused), before any of them is freed: calibration takes its statistics that
        way without holding a batch's intermediates. The visitor must not keep or change the arrays.

        A graph whose file fixes the batch to 1 (and whose tracer could not relax it) runs a larger batch
        sample by sample, so calibration and evaluation take any number of samples.
        """
        batch = _batch_size(self.graph, feeds) if self.single else 0
        if batch > 1:
            parts = [self.run({name: np.asarray(array)[i:i + 1] for name, array in feeds.items()}, keep_intermediates,
                              visit) for i in range(batch)]
            return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}
        arrays = validate_feeds(self.graph, feeds)
        batch = len(next(iter(arrays.values()))) if arrays else 0
        if keep_intermediates or visit is not None or not self.splits or batch < 2 * self.threads:
            with layer_threads(self.threads):
                if keep_intermediates or visit is not None:
                    return self._run(self.separate_steps, arrays, keep_intermediates, visit)
                return self._run(self.steps, arrays, False)
        bounds = np.linspace(0, batch, self.threads + 1).astype(int)
        slices = [{name: array[low:high] for name, array in arrays.items()} for low, high in zip(bounds, bounds[1:])]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads - 1, thread_name_prefix="dabuild-interpreter")
        with _blas_controller().limit(limits=1, user_api="blas"):
            others = [self._pool.submit(self._run, self.steps, part, False) for part in slices[1:]]
            parts = [self._run(self.steps, slices.pop(0), False)]  # this thread takes the first slice
            parts += [future.result() for future in others]
        return {name: np.concatenate([part[name] for part in parts]) for name in self.graph.outputs}

    def _run(self, steps: list[Step], arrays: dict[str, np.ndarray], keep: bool,
             visit: Visitor | None = None) -> dict[str, np.ndarray]:
        graph = self.graph
        values: dict[str, np.ndarray] = dict(graph.constants)
        values.update(arrays)
        if visit is not None:
            for name, array in arrays.items():
                visit(name, array)
        for step in steps:
            inputs = [values[name] for name in step.inputs]
            out = None
            if not keep:
                for name in step.finished:
                    del values[name]
                out = _overwritable(inputs, step.overwritable)
            results = step.kernel(inputs, out)
            del inputs, out
            values.update(zip(step.outputs, results))
            if visit is not None:
                for name, array in zip(step.outputs, results):
                    visit(name, array)
        if keep:
            return {name: array for name, array in values.items() if name not in graph.constants}
        return {name: values[name] for name in graph.outputs}


def _plan(graph: Graph, fusions: dict[int, Fusion], fuse_movement: bool = False) -> list[Step]:
    """The steps: one per node, except that a fused conv's step also does its add and activation, and with
    `fuse_movement` a run of data-movement nodes is one step (see `_fuse_movement`)."""
    absorbed = {index for fusion in fusions.values() for index in fusion.absorbed}
    steps: list[Step] = []
    in_place: list[tuple[int, ...]] = []
    kinds: list[str] = []
    for index, node in enumerate(graph.nodes):
        op = OPS[node.op]
        if index in fusions:
            fusion = fusions[index]
            assert isinstance(op, Conv)
            steps.append(Step(op.prepare_residual(node.attrs, fusion.then), [*node.inputs, fusion.residual],
                              fusion.outputs))
        elif index not in absorbed:
            steps.append(Step(op.prepare(node.attrs), list(node.inputs), list(node.outputs)))
        else:
            continue
        in_place.append(op.in_place)
        kinds.append(node.op if op.samplewise(node.attrs) else "")  # "": never fused as a move
    if fuse_movement:
        steps, in_place = _fuse_movement(graph, steps, in_place, kinds)
    last = {name: index for index, step in enumerate(steps) for name in step.inputs}
    keep = set(graph.outputs) | set(graph.constants) | {spec.name for spec in graph.inputs}
    for index, (step, positions) in enumerate(zip(steps, in_place)):
        step.finished = sorted({name for name in step.inputs if last[name] == index and name not in keep})
        step.overwritable = [position for position in positions
                             if step.inputs[position] in step.finished and step.inputs.count(step.inputs[position]) == 1]
    return steps


def _fuse_movement(graph: Graph, steps: list[Step], in_place: list[tuple[int, ...]],
                   kinds: list[str]) -> tuple[list[Step], list[tuple[int, ...]]]:
    """Each run of two or more consecutive samplewise data-movement steps (dabuild.ir.movement.MOVES) as one
    step of a FusedMovement: its inputs are what the run reads from before it, its outputs what later steps or the graph's
    outputs read. Consecutive in the plan's order, so everything it reads exists when it runs."""
    fused: list[Step] = []
    places: list[tuple[int, ...]] = []
    start = 0
    while start < len(steps):
        end = start
        while end < len(steps) and kinds[end] in MOVES:
            end += 1
        if end - start < 2:
            fused.append(steps[start])
            places.append(in_place[start])
            start += 1
            continue
        run = steps[start:end]
        made = {name for step in run for name in step.outputs}
        inputs = list(dict.fromkeys(name for step in run for name in step.inputs if name not in made))
        read_later = {name for step in steps[end:] for name in step.inputs} | set(graph.outputs)
        outputs = [name for step in run for name in step.outputs if name in read_later]
        kernel = FusedMovement([(step.kernel, step.inputs, step.outputs) for step in run], inputs, outputs)
        fused.append(Step(kernel, inputs, outputs))
        places.append(())
        start = end
    return fused, places


@dataclass
class Fusion:
    """A conv whose only reader is an add, run as one step with the add (and the add's activation, if any)."""

    residual: str  # the add's other operand
    then: tuple[str, dict[str, Any]]  # the activation after the add: op name and attributes, or ("none", {})
    absorbed: list[int]  # the add's node index, and the activation's
    outputs: list[str]  # the last absorbed node's outputs


def _fusions(graph: Graph) -> dict[int, Fusion]:
    """Fusions by conv node index: for each add, the operand computed last, if a conv made it for the add alone.

    The other operand must exist when that conv runs, which holds for the one computed first (a projection
    shortcut's conv often runs after the main path's last conv, so the shortcut conv is the fused one).
    """
    readers: dict[str, list[int]] = {}
    for index, node in enumerate(graph.nodes):
        for name in dict.fromkeys(node.inputs):
            readers.setdefault(name, []).append(index)
    made_at = {name: index for index, node in enumerate(graph.nodes) for name in node.outputs}
    outputs = set(graph.outputs)
    fusions: dict[int, Fusion] = {}
    for index, node in enumerate(graph.nodes):
        if node.op != "add" or node.inputs[0] == node.inputs[1]:
            continue
        (_, residual), (conv_at, made) = sorted((made_at.get(name, -1), name) for name in node.inputs)
        conv = graph.nodes[conv_at] if conv_at >= 0 else None
        if (conv is None or conv.op != "conv" or OPS["conv"].resolve(conv.attrs)["activation"] != "none"
                or made in outputs or readers[made] != [index]):
            continue
        then: tuple[str, dict[str, Any]] = ("none", {})
        absorbed, result = [index], node.outputs[0]
        following = readers.get(result, [])
        if result not in outputs and len(following) == 1:
            activation = graph.nodes[following[0]]
            if isinstance(OPS[activation.op], Activation) and activation.inputs == [result]:
                absorbed.append(following[0])
                result, then = activation.outputs[0], (activation.op, dict(activation.attrs))
        fusions[conv_at] = Fusion(residual, then, absorbed, [result])
    return fusions


def _fixed_single(graph: Graph) -> bool:
    """Whether every input and output fixes its batch to 1 (a file whose tracer could not relax it)."""
    if not graph.inputs or any(not spec.shape or spec.shape[0] != 1 for spec in graph.inputs):
        return False
    shapes = graph.tensor_shapes()
    return all(shapes[name].shape and shapes[name].shape[0] == 1 for name in graph.outputs)


def _batch_size(graph: Graph, feeds: dict[str, np.ndarray]) -> int:
    """The common leading size of the feeds (0 if they are incomplete or disagree: validate_feeds says so)."""
    if set(feeds) != {spec.name for spec in graph.inputs}:
        return 0
    sizes = {len(np.asarray(array)) for array in feeds.values()}
    return sizes.pop() if len(sizes) == 1 else 0


def _splittable(graph: Graph) -> bool:
    """Whether slices of a batch give the slices of its outputs: every node treats samples independently,
    every input has a dynamic batch axis, and convs make slices worth their threads."""
    return (any(node.op == "conv" for node in graph.nodes)
            and all(spec.shape and spec.shape[0] is None for spec in graph.inputs)
            and all(OPS[node.op].samplewise(node.attrs) for node in graph.nodes))


def _overwritable(arrays: list[np.ndarray], positions: list[int]) -> np.ndarray | None:
    """The first input array at one of `positions` that nothing but the `arrays` list reaches, or None.

    An identity, reshape or slice can make two tensors share one buffer, and
    writing into a buffer that a live tensor still shows would change that
    tensor. CPython's reference counts tell, compared with the counts of an
    array nothing else refers to. Whether the output fits the array is the
    kernel's decision.
    """
    for position in positions:
        if _references(arrays, position) != _ALONE:  # counted before `array` below adds a reference
            continue
        array = arrays[position]
        if not array.flags.writeable:
            continue
        if array.base is None or (isinstance(array.base, np.ndarray) and _base_references(array) == _ALONE_BASE):
            return array
    return None


@functools.cache
def _blas_controller() -> ThreadpoolController:
    """One ThreadpoolController for the process: making one scans the loaded libraries, too slow per run."""
    return ThreadpoolController()


def _references(arrays: list[np.ndarray], position: int) -> int:
    return sys.getrefcount(arrays[position])


def _base_references(view: np.ndarray) -> int:
    return sys.getrefcount(view.base)


_ALONE = _references([np.empty(1)], 0)  # only the list refers to the array
_ALONE_BASE = _base_references(np.empty(1)[:])  # only the view refers to its base


def run(graph: Graph, feeds: dict[str, np.ndarray], keep_intermediates: bool = False) -> dict[str, np.ndarray]:
    """The graph outputs by name; with `keep_intermediates`, every input and node output as well.

    Prepares the graph on every call; code running one graph on many batches keeps an `Interpreter`.
    """
    return Interpreter(graph).run(feeds, keep_intermediates)


def trace_layers(graph: Graph, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The per-layer trace for debug bundles: every node output by tensor name, in graph order."""
    values = run(graph, feeds, keep_intermediates=True)
    return {name: values[name] for node in graph.nodes for name in node.outputs}
