"""Data loading: the happy path on the digits data and every error a user can cause."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from dabuild.data import batches, load_inputs, load_labels
from dabuild.errors import UsageError
from dabuild.metrics import evaluate_metric

DIGITS = Path(__file__).resolve().parent.parent / "recipes" / "digits"


def spec(
    source: Path | str, x: str | dict[str, str] = "x", y: str | None = None, samples: int | None = None
) -> SimpleNamespace:
    return SimpleNamespace(source=Path(source), x=x, y=y, samples=samples, batch_size=64)


@pytest.fixture
def data_file(tmp_path: Path) -> Path:
    path = tmp_path / "d.npz"
    bad = np.ones((4, 2), np.float32)
    bad[1, 1] = np.nan
    np.savez(
        path,
        x=np.arange(8, dtype=np.float64).reshape(4, 2),
        a=np.ones((4, 2)),
        b=np.ones((3, 2)),
        y=np.array([1, 0, 1, 1]),
        y_short=np.array([1, 0, 1]),
        empty=np.zeros((0, 2)),
        bad=bad,
    )
    return path


def test_digits_inputs_labels_and_samples() -> None:
    evaluation = spec(DIGITS / "data.npz", x="x_test", y="y_test", samples=100)
    inputs = load_inputs(evaluation, ["x"])
    labels = load_labels(evaluation)
    assert inputs["x"].shape == (100, 64) and inputs["x"].dtype == np.float32
    assert labels is not None and labels.shape == (100,)
    assert load_labels(spec(DIGITS / "data.npz", x="x_test")) is None


def test_relative_source_and_input_mapping(data_file: Path) -> None:
    arrays = load_inputs(spec(data_file, x={"first": "x", "second": "a"}), ["first", "second"])
    assert sorted(arrays) == ["first", "second"]
    np.testing.assert_array_equal(arrays["first"], np.arange(8, dtype=np.float32).reshape(4, 2))


@pytest.mark.parametrize(
    ("x", "names", "message"),
    [
        ("nope", ["x"], "d.npz: no array 'nope'; arrays in the file: "),
        ("empty", ["x"], "d.npz: array 'empty' is empty (shape (0, 2))"),
        ("bad", ["x"], "d.npz: array 'bad' has 1 NaN or infinite values"),
        ({"p": "x", "q": "b"}, ["p", "q"], "d.npz: input arrays differ in their first dimension (x has 4, b has 3)"),
        ("x", ["p", "q"], "data x 'x' names one array but the graph has inputs p, q"),
        ({"p": "x"}, ["p", "q"], "data x maps inputs p but the graph has inputs p, q"),
    ],
)
def test_input_errors_name_file_and_key(
    data_file: Path, x: str | dict[str, str], names: list[str], message: str
) -> None:
    with pytest.raises(UsageError) as error:
        load_inputs(spec(data_file, x=x), names)
    assert message in str(error.value)


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="data file .*absent.npz does not exist"):
        load_inputs(spec(tmp_path / "absent.npz"), ["x"])


def test_label_errors(data_file: Path) -> None:
    with pytest.raises(UsageError, match="labels 'y_short' have 3 rows but inputs 'x' have 4"):
        load_labels(spec(data_file, y="y_short"))
    with pytest.raises(UsageError, match="d.npz: no array 'labels'"):
        load_labels(spec(data_file, y="labels"))
    # truncation applies to both, so a shorter label array is fine when samples cuts x to match
    assert load_labels(spec(data_file, y="y_short", samples=3)).tolist() == [1, 0, 1]


def test_batches_cover_every_row_once() -> None:
    arrays = {"x": np.arange(10).reshape(5, 2), "z": np.arange(5)}
    chunks = list(batches(arrays, 2))
    assert [len(c["x"]) for c in chunks] == [2, 2, 1]
    np.testing.assert_array_equal(np.concatenate([c["z"] for c in chunks]), arrays["z"])


def test_metrics() -> None:
    outputs = np.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4]])
    assert evaluate_metric("accuracy", outputs, np.array([1, 0, 0, 0])) == 0.75
    assert evaluate_metric("mse", np.array([1.0, 2.0]), np.array([1.0, 4.0])) == 2.0
    with pytest.raises(UsageError, match="unknown metric 'f1'; available: accuracy, mse"):
        evaluate_metric("f1", outputs, np.zeros(4))
    with pytest.raises(UsageError, match=r"accuracy needs labels of shape \(4,\)"):
        evaluate_metric("accuracy", outputs, np.zeros(3))
