"""The numpy frontend: run a plain numpy function on symbolic arrays and record what it does.

`SymbolicArray` stands in for each model input. numpy hands every ufunc and
array function touching it to `__array_ufunc__` / `__array_function__`, and the
Python operators land in its dunder methods; each becomes one graph node. Any
numpy array the function closes over becomes a float32 constant. What the
recorder does not know fails at once, naming the numpy function and the line
of the model that called it, instead of producing a wrong graph.
"""

from __future__ import annotations

import inspect
import traceback
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import numpy as np

from dabuild.errors import BuildError, DabuildError
from dabuild.ir.graph import Graph, Node, TensorSpec
from dabuild.ir.ops import OPS, ShapeError
from dabuild.trace.base import Shape, TracerPlugin, user_location

SUPPORTED = (
    "@ (matmul, dot), +, -, *, /, unary -, np.maximum(x, 0) (relu), np.tanh, np.clip, reshape, flatten, "
    "transpose / .T, indexing with slices, integers and None, np.concatenate, mean/sum/max over axes, "
    "np.einsum matrix products ('ij,jk->ik', 'bi,ij->bj', '...i,ij->...j')"
)
ENDLESS = 2**63 - 1  # a slice end past any axis (ONNX clamps it)


class UnsupportedOperation(BuildError):
    """The model used numpy functionality the tracer cannot record."""


def _unsupported(what: str) -> UnsupportedOperation:
    where = user_location(traceback.extract_stack())
    return UnsupportedOperation(f"{where}: {what} is not supported by the numpy tracer; supported: {SUPPORTED}")


class Recorder:
    """Collects the nodes and constants of one trace."""

    def __init__(self, input_names: list[str]):
        self.nodes: list[Node] = []
        self.constants: dict[str, np.ndarray] = {}
        self._constant_names: dict[tuple[tuple[int, ...], bytes], str] = {}
        self._used = set(input_names)

    def fresh(self, base: str) -> str:
        """`base_0`, `base_1`, ...: the first such name not yet taken (inputs included)."""
        index = 0
        while f"{base}_{index}" in self._used:
            index += 1
        self._used.add(f"{base}_{index}")
        return f"{base}_{index}"

    def constant(self, value: Any) -> str:
        """The name of a float32 constant holding `value`; equal values share one constant."""
        array = np.ascontiguousarray(value, dtype=np.float32)
        key = (array.shape, array.tobytes())
        if key not in self._constant_names:
            name = self.fresh("const")
            self.constants[name] = array
            self._constant_names[key] = name
        return self._constant_names[key]

    def spec(self, operand: Any) -> TensorSpec:
        if isinstance(operand, SymbolicArray):
            return TensorSpec(operand.name, operand.shape)
        name = self.constant(operand)
        return TensorSpec(name, self.constants[name].shape)

    def emit(self, op: str, operands: list[Any], attrs: dict[str, Any] | None = None) -> SymbolicArray:
        """Append one node reading `operands` (symbolic or constant values); its symbolic output."""
        attrs = attrs or {}
        specs = [self.spec(operand) for operand in operands]
        try:
            OPS[op].check_arity(len(specs))
            ((shape, _dtype),) = OPS[op].infer(specs, attrs)
        except ShapeError as error:
            raise BuildError(f"{user_location(traceback.extract_stack())}: {op}: {error}") from None
        name = self.fresh(op)
        self.nodes.append(Node(name, op, [spec.name for spec in specs], [name], attrs))
        return SymbolicArray(self, name, tuple(shape))


_UFUNC_OPS: dict[Any, str] = {
    np.add: "add", np.subtract: "sub", np.multiply: "mul", np.true_divide: "div", np.matmul: "matmul", np.tanh: "tanh",
}
_REDUCTIONS: dict[Any, str] = {np.mean: "reduce_mean", np.sum: "reduce_sum", np.max: "reduce_max", np.amax: "reduce_max"}


def _index_plan(index: Any, rank: int) -> tuple[dict[str, list[int]], list[int], list[int]] | None:
    """For `x[index]` with slices, integers, None and one Ellipsis: slice attrs, axes to squeeze (integers),
    output positions to unsqueeze (None); None for any other index."""
    items = list(index) if isinstance(index, tuple) else [index]
    if sum(item is Ellipsis for item in items) > 1:
        return None
    if Ellipsis in items:
        at = items.index(Ellipsis)
        items[at:at + 1] = [slice(None)] * (rank - sum(item is not None for item in items) + 1)
    if sum(item is not None for item in items) > rank:
        return None
    plan: dict[str, list[int]] = {"starts": [], "ends": [], "axes": [], "steps": []}
    squeeze: list[int] = []
    unsqueeze: list[int] = []
    axis = position = 0  # the input axis and the output position the next item refers to
    for item in items:
        if item is None:
            unsqueeze.append(position)
            position += 1
            continue
        if isinstance(item, (int, np.integer)) and not isinstance(item, bool):
            start, end, step = int(item), int(item) + 1 if item != -1 else ENDLESS, 1
            squeeze.append(axis)
        elif isinstance(item, slice) and all(
            v is None or isinstance(v, (int, np.integer)) for v in (item.start, item.stop, item.step)
        ):
            position += 1
            if item == slice(None):
                axis += 1
                continue
            step = 1 if item.step is None else int(item.step)
            default_start, default_end = (0, ENDLESS) if step > 0 else (-1, -ENDLESS - 1)
            start = default_start if item.start is None else int(item.start)
            end = default_end if item.stop is None else int(item.stop)
        else:
            return None
        for key, value in zip(("starts", "ends", "axes", "steps"), (start, end, axis, step)):
            plan[key].append(value)
        axis += 1
    return plan, squeeze, unsqueeze


def _matmul_subscripts(subscripts: str) -> bool:
    """Whether an einsum is a matrix product x @ W over x's last axis: '<a>k,kn-><a>n' ('...' allowed in <a>)."""
    spec = subscripts.replace(" ", "")
    if spec.count("->") != 1 or spec.count(",") != 1:
        return False
    inputs, output = spec.split("->")
    left, right = inputs.split(",")
    return (
        len(right) == 2 and right[0] != right[1] and len(left) >= 1 and left[-1] == right[0]
        and output == left[:-1] + right[1] and right[1] not in left and len(set(left.replace(".", ""))) ==
        len(left.replace(".", ""))
    )


class SymbolicArray:
    """A float32 array known only by shape while the model runs; operations on it are recorded."""

    __array_priority__ = 1000  # win over ndarray in mixed binary operators

    def __init__(self, recorder: Recorder, name: str, shape: Shape):
        self.recorder = recorder
        self.name = name
        self.shape = shape

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.float32)

    def __repr__(self) -> str:
        return f"SymbolicArray({self.name!r}, shape={self.shape})"

    # operators
    def __matmul__(self, other: Any) -> SymbolicArray:
        return self.recorder.emit("matmul", [self, other])

    def __rmatmul__(self, other: Any) -> SymbolicArray:
        return self.recorder.emit("matmul", [other, self])

    def __add__(self, other: Any) -> SymbolicArray:
        return self.recorder.emit("add", [self, other])

    def __radd__(self, other: Any) -> SymbolicArray:
        return self.recorder.emit("add", [other, self])

    def __sub__(self, other: Any) -> SymbolicArray:
        return self.recorder.emit("sub", [self, other])

    def __rsub__(self, other: Any) -> SymbolicArray:
        return self.recorder.emit("sub", [other, self])

    def __mul__(self, other: Any) -> SymbolicArray:
        return self.recorder.emit("mul", [self, other])

    def __rmul__(self, other: Any) -> SymbolicArray:
        return self.recorder.emit("mul", [other, self])

    def __neg__(self) -> SymbolicArray:
        return self.recorder.emit("mul", [self, -1.0])

    def __truediv__(self, other: Any) -> SymbolicArray:
        return self.recorder.emit("div", [self, other])

    def __rtruediv__(self, other: Any) -> SymbolicArray:
        return self.recorder.emit("div", [other, self])

    def __getitem__(self, index: Any) -> SymbolicArray:
        """Basic indexing: slices (any step), integers (the axis is dropped), None (np.newaxis), one Ellipsis."""
        found = _index_plan(index, self.ndim)
        if found is None:
            raise _unsupported(f"indexing a traced array with {index!r}")
        plan, squeeze, unsqueeze = found
        result = self.recorder.emit("slice", [self], plan) if plan["axes"] else self
        result = self.recorder.emit("squeeze", [result], {"axes": squeeze}) if squeeze else result
        return self.recorder.emit("unsqueeze", [result], {"axes": unsqueeze}) if unsqueeze else result

    @property
    def T(self) -> SymbolicArray:
        return self.transpose()

    def transpose(self, *axes: Any) -> SymbolicArray:
        perm = axes[0] if (len(axes) == 1 and isinstance(axes[0], (tuple, list))) or axes == (None,) else axes
        return self.recorder.emit("transpose", [self], {"perm": [int(a) for a in perm] if perm else None})

    def mean(self, axis: Any = None, keepdims: bool = False) -> SymbolicArray:
        return self._reduce("reduce_mean", axis, keepdims)

    def sum(self, axis: Any = None, keepdims: bool = False) -> SymbolicArray:
        return self._reduce("reduce_sum", axis, keepdims)

    def max(self, axis: Any = None, keepdims: bool = False) -> SymbolicArray:
        return self._reduce("reduce_max", axis, keepdims)

    def _reduce(self, op: str, axis: Any, keepdims: bool) -> SymbolicArray:
        axes = None if axis is None else [int(a) for a in (axis if isinstance(axis, (tuple, list)) else [axis])]
        return self.recorder.emit(op, [self], {"axes": axes, "keepdims": bool(keepdims)})

    # methods
    def reshape(self, *shape: Any) -> SymbolicArray:
        """numpy's reshape; a None size (from the dynamic `x.shape[0]`) keeps that axis dynamic."""
        sizes = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        target = []
        for axis, size in enumerate(sizes):
            if size is None:
                if axis >= self.ndim or self.shape[axis] is not None:
                    raise _unsupported(f"reshape with a None size at axis {axis} of {self.shape}")
                size = 0  # the reshape op's "copy this axis"
            target.append(int(size))
        return self.recorder.emit("reshape", [self], {"shape": target})

    def flatten(self) -> SymbolicArray:
        return self.reshape(-1)

    # everything numpy routes to us
    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *operands: Any, **kwargs: Any) -> SymbolicArray:
        if method != "__call__":
            raise _unsupported(f"numpy.{ufunc.__name__}.{method}")
        if kwargs:
            raise _unsupported(f"numpy.{ufunc.__name__} with keyword arguments {', '.join(kwargs)}")
        if ufunc is np.maximum:
            return self._relu(operands)
        if ufunc in _UFUNC_OPS:
            return self.recorder.emit(_UFUNC_OPS[ufunc], list(operands))
        if ufunc is np.negative:
            return -self
        raise _unsupported(f"numpy.{ufunc.__name__}")

    def _relu(self, operands: tuple[Any, ...]) -> SymbolicArray:
        """np.maximum(x, 0) or np.maximum(0, x); any other maximum is not a relu."""
        symbolic = [o for o in operands if isinstance(o, SymbolicArray)]
        others = [o for o in operands if not isinstance(o, SymbolicArray)]
        if len(symbolic) != 1 or np.size(others[0]) != 1 or np.asarray(others[0]).item() != 0:
            raise _unsupported("numpy.maximum other than maximum(x, 0)")
        return self.recorder.emit("relu", symbolic)

    def __array_function__(self, func: Callable, types: Any, args: Any, kwargs: Any) -> SymbolicArray:
        handler = _ARRAY_FUNCTIONS.get(func)
        if handler is not None:
            try:
                return handler(self.recorder, *args, **kwargs)
            except TypeError:  # an argument the handler does not take
                raise _unsupported(f"numpy.{func.__name__} with arguments {', '.join(kwargs) or 'given'}") from None
        if func is np.reshape:
            array, shape = (list(args) + [kwargs.pop("shape", kwargs.pop("newshape", None))])[:2]
            if kwargs or not isinstance(array, SymbolicArray):
                raise _unsupported("numpy.reshape with extra arguments")
            return array.reshape(shape)
        if func is np.dot and not kwargs and len(args) == 2 and all(
                a.ndim <= 2 if isinstance(a, SymbolicArray) else np.ndim(a) <= 2 for a in args):
            return self.recorder.emit("matmul", list(args))  # dot and matmul agree up to 2-D
        raise _unsupported(f"numpy.{func.__name__}")

    # conversions that would leak a concrete value into Python control flow
    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise _unsupported("converting a traced array to a concrete numpy array")

    def __len__(self) -> int:
        raise _unsupported("len() of a traced array (its batch axis is dynamic; use x.shape[1:] or reshape(-1, ...))")

    def __bool__(self) -> bool:
        raise _unsupported("branching on a traced array's value")

    def __iter__(self) -> Any:
        raise _unsupported("iterating over a traced array")

    def __pow__(self, other: Any) -> SymbolicArray:
        raise _unsupported("power")


def _transpose(recorder: Recorder, array: Any, axes: Any = None) -> SymbolicArray:
    return array.transpose(axes)


def _concatenate(recorder: Recorder, arrays: Any, axis: int = 0) -> SymbolicArray:
    return recorder.emit("concat", list(arrays), {"axis": int(axis)})


def _clip(recorder: Recorder, array: Any, a_min: Any = None, a_max: Any = None, **bounds: Any) -> SymbolicArray:
    """np.clip with scalar bounds (numpy 2 also spells them min= / max=)."""
    low, high = bounds.pop("min", a_min), bounds.pop("max", a_max)
    if bounds or any(v is not None and np.size(v) != 1 for v in (low, high)):
        raise _unsupported("numpy.clip other than with scalar bounds")
    attrs = {key: float(np.asarray(v).item()) for key, v in (("min", low), ("max", high)) if v is not None}
    return recorder.emit("clip", [array], attrs)


def _einsum(recorder: Recorder, subscripts: Any, *operands: Any) -> SymbolicArray:
    if not isinstance(subscripts, str) or len(operands) != 2 or not _matmul_subscripts(subscripts):
        raise _unsupported(f"numpy.einsum({subscripts!r}, ...) other than a matrix product like 'bi,ij->bj'")
    return recorder.emit("matmul", list(operands))


def _reduction(op: str) -> Callable[..., SymbolicArray]:
    def reduce(recorder: Recorder, array: Any, axis: Any = None, keepdims: bool = False) -> SymbolicArray:
        return array._reduce(op, axis, keepdims)

    return reduce


_ARRAY_FUNCTIONS: dict[Any, Callable[..., SymbolicArray]] = {
    np.transpose: _transpose,
    np.concatenate: _concatenate,
    np.clip: _clip,
    np.einsum: _einsum,
    **{func: _reduction(op) for func, op in _REDUCTIONS.items()},
}


class NumpyTracer(TracerPlugin):
    """Frontend for models that are plain Python callables over numpy arrays."""

    suffixes: ClassVar[tuple[str, ...]] = ()

    def apply_model(self, inputs: dict[str, Any]) -> Any:
        """Call the model: one input positionally, several by keyword when the parameters are named so."""
        if len(inputs) == 1:
            return self.model(*inputs.values())
        try:
            parameters: Mapping[str, inspect.Parameter] = inspect.signature(self.model).parameters
        except (TypeError, ValueError):
            parameters = {}
        if set(inputs) <= set(parameters):
            return self.model(**inputs)
        return self.model(*inputs.values())

    def trace(self) -> Graph:
        if not callable(self.model):
            raise BuildError(f"the numpy frontend traces callables; got a {type(self.model).__name__}")
        shapes = self.get_input_shapes()
        recorder = Recorder(list(shapes))
        symbolic = {name: SymbolicArray(recorder, name, shape) for name, shape in shapes.items()}
        try:
            result = self.apply_model(symbolic)
        except DabuildError:
            raise
        except Exception as error:
            where = user_location(traceback.extract_tb(error.__traceback__))
            raise BuildError(f"{where}: the model raised {type(error).__name__} while tracing: {error}") from error
        results = list(result) if isinstance(result, (tuple, list)) else [result]
        if not results or not all(isinstance(r, SymbolicArray) for r in results):
            raise BuildError(
                f"the model returned {type(result).__name__}; expected an array computed from its inputs "
                "(or a tuple of them)"
            )
        return Graph(
            inputs=[TensorSpec(name, shape) for name, shape in shapes.items()],
            outputs=[r.name for r in results],
            nodes=recorder.nodes,
            constants=recorder.constants,
        )
