"""The numpy frontend and the trace stage, on the digits example and on small broken models."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from dabuild import plugins
from dabuild.errors import BuildError, UsageError
from dabuild.ir import Graph
from dabuild.ir.interpreter import run
from dabuild.ir.npz import read_npz
from dabuild.ir.passes import optimize
from dabuild.progress import Progress
from dabuild.trace import load_model, trace_model, trace_stage
from dabuild.trace.base import choose_framework
from dabuild.trace.numpy_tracer import UnsupportedOperation

DIGITS = Path(__file__).resolve().parent.parent / "recipes" / "digits"


def digits_spec() -> SimpleNamespace:
    """What the recipe's ModelSpec holds for the digits example (its paths absolute, as a loaded recipe's are)."""
    return SimpleNamespace(framework=None, source=f"{DIGITS / 'model.py'}:build", weights=DIGITS / "weights.npz",
                           inputs={"x": [1, 64]})


def write_model(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "net.py"
    path.write_text("import numpy as np\n\n" + body)
    return path


def trace_source(tmp_path: Path, body: str, attr: str = "forward") -> Graph:
    model = load_model(f"{write_model(tmp_path, body)}:{attr}", None)
    return trace_model(model, inputs={"x": (1, 4)})


def test_digits_traces_to_three_dense_nodes(tmp_path: Path) -> None:
    trace_stage(digits_spec(), tmp_path, Progress.silent())
    graph = Graph.load(tmp_path)
    assert [(n.op, n.attrs["activation"]) for n in graph.nodes] == [
        ("dense", "relu"),
        ("dense", "relu"),
        ("dense", "none"),
    ]
    assert graph.inputs[0].shape == (None, 64)


def test_traced_digits_graph_computes_what_the_function_does() -> None:
    forward = load_model(f"{DIGITS / 'model.py'}:build", DIGITS / "weights.npz")
    graph = optimize(trace_model(forward, inputs={"x": (1, 64)}))
    x = read_npz(DIGITS / "data.npz")["x_test"]
    traced = run(graph, {"x": x})[graph.outputs[0]]
    np.testing.assert_allclose(traced, forward(x), atol=1e-5, rtol=0)


def test_load_model_imports_under_a_fresh_name_and_restores_sys_path(tmp_path: Path) -> None:
    (tmp_path / "helper.py").write_text("SCALE = 3.0\n")
    write_model(tmp_path, "from helper import SCALE\n\ndef forward(x):\n    return x * SCALE\n")
    before = list(sys.path)
    first = load_model(f"{tmp_path / 'net.py'}:forward", None)
    second = load_model(f"{tmp_path / 'net.py'}:forward", None)
    assert sys.path == before
    assert first.__module__ != second.__module__
    assert first.__module__ not in ("net", "__main__")


def test_plain_function_is_traced_as_numpy() -> None:
    def scale(x: np.ndarray) -> np.ndarray:
        return 2.0 * x - 1.0

    assert choose_framework(scale) == "numpy"
    graph = trace_model(scale, inputs={"x": (1, 3)})
    x = np.array([[0.0, 0.5, 1.0]], np.float32)
    np.testing.assert_allclose(run(graph, {"x": x})[graph.outputs[0]], scale(x))


def test_unknown_framework_lists_installed_plugins() -> None:
    with pytest.raises(UsageError) as error:
        trace_model(lambda x: x, framework="tensorflow", inputs={"x": (1, 2)})
    message = str(error.value)
    assert "unknown framework 'tensorflow'" in message
    assert "available: " + ", ".join(plugins.available(plugins.TRACERS)) in message
    assert "numpy" in message


def test_model_from_a_known_framework_without_tracer_is_not_guessed() -> None:
    class Module:
        def __call__(self, x: np.ndarray) -> np.ndarray:
            return x

    Module.__module__ = "tensorflow.python.module.module"
    with pytest.raises(UsageError, match="unknown framework 'tensorflow'.*available: .*numpy"):
        trace_model(Module(), inputs={"x": (1, 2)})


def test_unsupported_op_names_the_function_and_the_line(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedOperation) as error:
        trace_source(tmp_path, "def forward(x):\n    h = x * 2.0\n    return np.exp(h)\n")
    message = str(error.value)
    assert message.startswith(f"{tmp_path / 'net.py'}:5: numpy.exp is not supported")
    assert "supported: " in message


def test_maximum_with_nonzero_is_not_mistaken_for_relu(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedOperation, match="net.py:4: numpy.maximum other than maximum"):
        trace_source(tmp_path, "def forward(x):\n    return np.maximum(x, 0.5)\n")


def test_model_raising_during_trace_names_file_and_error(tmp_path: Path) -> None:
    with pytest.raises(BuildError) as error:
        trace_source(tmp_path, "def forward(x):\n    raise RuntimeError('no weights yet')\n")
    assert str(error.value) == f"{tmp_path / 'net.py'}:4: the model raised RuntimeError while tracing: no weights yet"


def test_shape_mismatch_in_the_model_is_reported_where_it_happens(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match=r"net\.py:4: matmul: matmul inner dimensions differ"):
        trace_source(tmp_path, "def forward(x):\n    return x @ np.ones((3, 2))\n")


def test_reshape_keeps_the_batch_dynamic(tmp_path: Path) -> None:
    graph = trace_source(tmp_path, "def forward(x):\n    return np.reshape(x, (x.shape[0], 2, 2)).reshape(-1, 4)\n")
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(run(graph, {"x": x})[graph.outputs[0]], x)


@pytest.mark.parametrize(
    ("source", "error", "message"),
    [
        ("missing.py:forward", UsageError, "missing.py does not exist"),
        ("net.py:backward", UsageError, "net.py has no attribute 'backward'"),
        ("forward", UsageError, "must be 'file.py:attr'"),
        ("no_such_package.mod:forward", UsageError, "cannot import model module 'no_such_package.mod'"),
    ],
)
def test_load_model_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, error: type,
                           message: str) -> None:
    write_model(tmp_path, "def forward(x):\n    return x\n")
    monkeypatch.chdir(tmp_path)  # relative paths are taken as written (a loaded recipe's are absolute)
    with pytest.raises(error) as raised:
        load_model(source, None)
    assert message in str(raised.value)


def test_load_model_reports_import_failures_with_location(tmp_path: Path) -> None:
    write_model(tmp_path, "1 / 0\n")
    with pytest.raises(BuildError, match=r"net\.py:3: importing .*net\.py failed: ZeroDivisionError"):
        load_model(f"{tmp_path / 'net.py'}:forward", None)


def test_missing_input_shapes_are_asked_for() -> None:
    with pytest.raises(UsageError, match="set model.inputs"):
        trace_model(lambda x: x)


W = np.random.default_rng(5).standard_normal((4, 3)).astype(np.float32)


def every_spelling(x: np.ndarray) -> np.ndarray:
    """Each numpy spelling the tracer records, so the traced graph can be compared with plain numpy."""
    h = np.einsum("bi,ij->bj", x, W) / 2.0 + np.einsum("...i,ij->...j", x, W) - np.einsum("ij,jk->ik", x, W)
    h = np.concatenate([np.tanh(h), x[:, 1:3], 1.0 / x[:, :1]], axis=1)  # (batch, 6)
    h = np.transpose(h.T).transpose(0, 1)
    centred = h - h.mean(axis=1, keepdims=True) + np.sum(h, axis=-1, keepdims=True) * 0.1
    peak = np.max(centred, axis=1, keepdims=True) + centred.max(axis=-1, keepdims=True)
    return np.clip(centred - peak, -1.5, 0.0)[..., ::-2] + x[:, 0][..., None] * x[None, :, -1].T + x[1:2, None, 0]


def test_numpy_spellings_trace_to_the_same_computation() -> None:
    graph = trace_model(every_spelling, inputs={"x": (1, 4)})
    ops = {node.op for node in graph.nodes}
    assert {"div", "concat", "tanh", "transpose", "slice", "squeeze", "reduce_mean", "reduce_sum", "reduce_max",
            "clip", "matmul", "unsqueeze"} <= ops
    x = np.random.default_rng(6).uniform(0.5, 2.0, (5, 4)).astype(np.float32)
    expected = every_spelling(x)
    for candidate in (graph, optimize(graph)):
        np.testing.assert_allclose(run(candidate, {"x": x})[candidate.outputs[0]], expected, rtol=1e-5, atol=1e-5)
    assert [n.op for n in optimize(trace_model(lambda x: np.einsum("bi,ij->bj", x, W), inputs={"x": (1, 4)})).nodes] \
        == ["dense"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("return np.einsum('ij,kj->ik', x, np.ones((3, 4)))", "numpy.einsum('ij,kj->ik', ...) other than a matrix"),
        ("return x[[0, 1]]", "indexing a traced array with [0, 1]"),
        ("return np.clip(x, np.zeros(4), 1.0)", "numpy.clip other than with scalar bounds"),
        ("return np.mean(x, axis=1, dtype=np.float64)", "numpy.mean with arguments axis, dtype"),
    ],
)
def test_unsupported_spellings_name_the_line(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(UnsupportedOperation) as error:
        trace_source(tmp_path, f"def forward(x):\n    {body}\n")
    assert str(error.value).startswith(f"{tmp_path / 'net.py'}:4: ")
    assert message in str(error.value)
