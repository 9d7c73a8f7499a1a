"""Conformance: the ONNX backend node test cases of every op the frontend claims, run through dabuild.

The onnx package ships the generators of its backend node tests
(onnx.backend.test.case.node), not their data; the cases are generated here by
importing the generator module of each claimed op. Each case's model goes
through dabuild's ONNX frontend and passes, then dabuild's IR interpreter, and
its outputs must match the case's expected ones within the case's rtol/atol.

Inputs that dabuild needs at load time (shapes, axes, pads: the converters'
`static` positions) are turned into initializers holding the case's values,
as an exporter would write them.

A case dabuild does not model is skipped only when `OUT_OF_SCOPE` lists it, and
only after checking that dabuild rejects it with a UsageError (so a skip can
never hide a crash or a wrong answer, and a stale entry fails). Run this file
as a script for the counts: `python tests/frontends/test_onnx_conformance.py`.
"""

from __future__ import annotations

import importlib
import pkgutil
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import numpy_helper  # noqa: E402

from dabuild.errors import UsageError  # noqa: E402
from dabuild.ir.interpreter import run  # noqa: E402
from dabuild.ir.passes import optimize  # noqa: E402
from dabuild.trace import trace_model  # noqa: E402
from dabuild.trace.onnx_frontend import SUPPORTED_OPS  # noqa: E402
from dabuild.trace.onnx_frontend.converters import CONVERTERS  # noqa: E402


def _nodes(case: Any) -> list[Any]:
    return list(case.model.graph.node)


def _static_size(case: Any, name: str) -> int:
    """The element count of a case's input `name` (an initializer once its static inputs are baked)."""
    names = [info.name for info in case.model.graph.input]
    ((inputs, _),) = case.data_sets
    return int(np.asarray(_array(inputs[names.index(name)])).size) if name in names else 1


def _attr(node: Any, name: str, default: Any = None) -> Any:
    found = [a for a in node.attribute if a.name == name]
    return onnx.helper.get_attribute_value(found[0]) if found else default


_FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE}

# Every kind of case dabuild does not run, with the reason. One place, on purpose: each entry is
# (reason, test on the case and its run-time feeds), and a matching case must be rejected by dabuild.
OUT_OF_SCOPE: list[tuple[str, Callable[[Any, dict[str, np.ndarray]], bool]]] = [
    (
        "function-expanded variant using ops outside SUPPORTED_OPS",
        lambda case, feeds: len(_nodes(case)) > 1 and any(n.op_type not in SUPPORTED_OPS for n in _nodes(case)),
    ),
    (
        "sequence or optional inputs (dabuild graphs take tensors)",
        lambda case, feeds: any(not info.type.HasField("tensor_type") for info in case.model.graph.input),
    ),
    (
        "non-float run-time inputs (dabuild graphs compute in float32)",
        lambda case, feeds: any(value.dtype.kind != "f" for value in feeds.values()),
    ),
    (
        "Cast to a non-float element type",
        lambda case, feeds: any(n.op_type == "Cast" and _attr(n, "to") not in _FLOAT_TYPES for n in _nodes(case)),
    ),
    (
        ("quantized (integer or float8) outputs (dabuild graphs give real values; quantization inside a graph is given "
        "quantization, tests/frontends/test_qdq_import.py)"),
        lambda case, feeds: any(n.op_type in ("QuantizeLinear", "QLinearConv", "QLinearMatMul") for n in _nodes(case))
        and any(info.type.tensor_type.elem_type not in _FLOAT_TYPES for info in case.model.graph.output),
    ),
    (
        "DequantizeLinear of a run-time input (dabuild graphs take real values)",
        lambda case, feeds: any(n.op_type == "DequantizeLinear" and n.input[0] in feeds for n in _nodes(case)),
    ),
    (
        "float64 computation (refused: dabuild computes in float32, which would change the results)",
        lambda case, feeds: any(value.dtype == np.float64 for value in feeds.values())
        or any(n.op_type == "Cast" and _attr(n, "to") == onnx.TensorProto.DOUBLE for n in _nodes(case)),
    ),
    ("MaxPool's Indices output", lambda case, feeds: any(n.op_type == "MaxPool" and len(n.output) > 1 for n in _nodes(case))),
    (
        "Resize modes cubic and tf_crop_and_resize, and antialiasing (dabuild resizes nearest and linear)",
        lambda case, feeds: any(
            n.op_type == "Resize" and (_attr(n, "mode") == b"cubic" or _attr(n, "antialias", 0)
                                      or _attr(n, "coordinate_transformation_mode") == b"tf_crop_and_resize")
            for n in _nodes(case)
        ),
    ),
    (
        "Pow with an exponent that is not one number (dabuild raises to a constant power)",
        lambda case, feeds: any(
            n.op_type == "Pow" and (n.input[1] in feeds or _static_size(case, n.input[1]) != 1) for n in _nodes(case)
        ),
    ),
    (
        "dilated average pooling",
        lambda case, feeds: any(
            n.op_type == "AveragePool" and any(d != 1 for d in _attr(n, "dilations", [])) for n in _nodes(case)
        ),
    ),
    (
        "training mode",
        lambda case, feeds: any(
            (n.op_type == "BatchNormalization" and _attr(n, "training_mode", 0))
            or (n.op_type == "Dropout" and len(n.input) > 2 and n.input[2])
            for n in _nodes(case)
        ),
    ),
    ("Reshape allowzero with a zero-sized dimension", lambda case, feeds: "allowzero" in case.name),
]

@dataclass
class Outcome:
    passed: bool
    skipped: str | None = None
    failure: str | None = None


class _AmongOps(frozenset):
    """Stands in for the one op type onnx's case collector filters on, accepting any claimed op.

    `collect_testcases(op_type)` sets the module global `_TargetOpType` that `expect` compares
    each case's op type with (`!=`); this set answers that comparison for all claimed ops at once.
    """

    def __ne__(self, other: object) -> bool:
        return other not in self

    def __eq__(self, other: object) -> bool:
        return other in self

    __hash__ = frozenset.__hash__


def _module_key(name: str) -> str:
    return name.replace("_", "").lower()


@cache
def cases_by_op() -> dict[str, list[Any]]:
    """The generated backend node cases of every claimed op (only their generator modules are imported)."""
    import onnx.backend.test.case.node as node_cases

    node_cases._TargetOpType = _AmongOps(SUPPORTED_OPS)
    wanted = {_module_key(op) for op in SUPPORTED_OPS}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for module in pkgutil.iter_modules(node_cases.__path__):
            if _module_key(module.name) in wanted:
                importlib.import_module(f"{node_cases.__name__}.{module.name}")
    grouped: dict[str, list[Any]] = {op: [] for op in SUPPORTED_OPS}
    for case in node_cases._NodeTestCases:
        ops = [node.op_type for node in case.model.graph.node]
        owner = next((op for op in ops if op in grouped), None)
        if owner is not None:
            grouped[owner].append(case)
    return grouped


def _array(value: Any) -> np.ndarray:
    return numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else np.asarray(value)


def bake_static_inputs(model: Any, feeds: dict[str, np.ndarray]) -> tuple[Any, dict[str, np.ndarray]]:
    """Turn graph inputs read at a converter's static positions into initializers, as exporters do."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    static: set[str] = set()
    for node in graph.node:
        converter = CONVERTERS.get(node.op_type)
        for position in converter.static if converter else ():
            if position < len(node.input) and node.input[position] in feeds:
                static.add(node.input[position])
    kept = [info for info in graph.input if info.name not in static]
    del graph.input[:]
    graph.input.extend(kept)
    graph.initializer.extend(numpy_helper.from_array(feeds[name], name) for name in sorted(static))
    return model, {name: value for name, value in feeds.items() if name not in static}


def scope_reason(case: Any, feeds: dict[str, np.ndarray]) -> str | None:
    """Why dabuild does not run this case, or None when it should."""
    return next((reason for reason, applies in OUT_OF_SCOPE if applies(case, feeds)), None)


def run_case(case: Any) -> Outcome:
    ((inputs, expected),) = case.data_sets
    names = [info.name for info in case.model.graph.input]
    feeds = dict(zip(names, (_array(value) for value in inputs)))
    model, feeds = bake_static_inputs(case.model, feeds)
    reason = scope_reason(case, feeds)
    try:
        graph = optimize(trace_model(model, framework="onnx"))
    except UsageError as error:
        if reason is not None:
            return Outcome(passed=False, skipped=reason)
        return Outcome(passed=False, failure=f"rejected: {error}")
    except Exception as error:  # noqa: BLE001 -- reported as the case's failure
        return Outcome(passed=False, failure=f"conversion crashed: {type(error).__name__}: {error}")
    if reason is not None:
        return Outcome(passed=False, failure=f"listed as out of scope ({reason}) but dabuild converts it")
    try:
        results = run(graph, feeds)
    except Exception as error:  # noqa: BLE001
        return Outcome(passed=False, failure=f"interpreter: {type(error).__name__}: {error}")
    mismatch = compare(graph.outputs, results, expected, case)
    return Outcome(passed=mismatch is None, failure=mismatch)


def compare(names: list[str], results: dict[str, np.ndarray], expected: Any, case: Any) -> str | None:
    """What differs beyond the case's tolerance, or None."""
    for name, want in zip(names, expected):
        want, got = _array(want), np.asarray(results[name])
        if got.shape != want.shape:
            return f"output {name!r} has shape {got.shape}, expected {want.shape}"
        try:
            np.testing.assert_allclose(got, want, rtol=case.rtol, atol=case.atol)
        except AssertionError as error:
            return f"output {name!r}: {error}"
    return None


def test_every_claimed_op_has_cases() -> None:
    missing = [op for op, cases in cases_by_op().items() if not cases and "." not in op]  # contrib ops: none
    assert not missing, f"no backend test cases found for {missing}"


@pytest.mark.parametrize("op_type", SUPPORTED_OPS)
def test_op_conformance(op_type: str) -> None:
    outcomes = {case.name: run_case(case) for case in cases_by_op()[op_type]}
    failures = [f"{name}: {outcome.failure}" for name, outcome in outcomes.items() if outcome.failure]
    assert not failures, "\n".join(failures)
    if not any(outcome.passed for outcome in outcomes.values()):
        pytest.skip("; ".join(sorted({str(outcome.skipped) for outcome in outcomes.values()})))


if __name__ == "__main__":
    totals: Counter[str] = Counter()
    for op, op_cases in cases_by_op().items():
        for case in op_cases:
            outcome = run_case(case)
            key = "passed" if outcome.passed else "failed" if outcome.failure else f"skipped: {outcome.skipped}"
            totals[key] += 1
            if outcome.failure:
                print(f"FAIL {op} {case.name}: {outcome.failure[:300]}")
    print(f"{sum(totals.values())} cases")
    for key, count in sorted(totals.items()):
        print(f"  {count:4d} {key}")
