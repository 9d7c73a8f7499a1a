"""Built-in metrics by name: top-k accuracy (`top_k`, `top_<k>`) and how recipes accept or reject metric names."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from dabuild.errors import BuildError, ValidationError
from dabuild.recipe import load_recipe
from dabuild.tune.metric import load_metric

REPO = Path(__file__).resolve().parent.parent


def top_k_by_sorting(outputs: np.ndarray, labels: np.ndarray, k: int) -> float:
    """Independent reference: a stable descending sort per row, label within its first k entries."""
    order = np.argsort(-outputs, axis=1, kind="stable")[:, :k]
    return float(np.mean([label in row for row, label in zip(order, labels)]))


@pytest.mark.parametrize(("name", "k"), [("top_k", 5), ("top_3", 3), ("top_1", 1), ("top_12", 12)])
def test_top_k_is_the_share_of_labels_among_the_k_largest_outputs(name: str, k: int) -> None:
    rng = np.random.default_rng(k)
    outputs = rng.normal(size=(400, 16))
    labels = rng.integers(0, 16, size=400)
    metric = load_metric(name)
    assert metric.higher_is_better
    assert metric(outputs, labels) == pytest.approx(top_k_by_sorting(outputs, labels, k))


def test_top_k_grows_with_k_and_reaches_one_when_every_label_is_in_reach() -> None:
    rng = np.random.default_rng(0)
    outputs = rng.normal(size=(300, 10))
    labels = rng.integers(0, 10, size=300)
    scores = [load_metric(f"top_{k}")(outputs, labels) for k in range(1, 10)]
    assert scores == sorted(scores) and scores[0] < scores[-1]
    ranked_second = np.argsort(-outputs, axis=1)[:, 1]
    assert load_metric("top_2")(outputs, ranked_second) == 1.0
    assert load_metric("top_1")(outputs, ranked_second) == 0.0


def test_top_1_equals_accuracy_even_with_the_ties_quantized_outputs_have() -> None:
    rng = np.random.default_rng(1)
    outputs = rng.integers(-2, 3, size=(500, 6)).astype(np.float32) * 0.25  # few levels: many ties
    labels = rng.integers(0, 6, size=500)
    assert load_metric("top_1")(outputs, labels) == load_metric("accuracy")(outputs, labels)
    assert load_metric("top_3")(outputs, labels) == pytest.approx(top_k_by_sorting(outputs, labels, 3))


def test_top_k_rejects_k_covering_every_class_and_mismatched_labels() -> None:
    outputs = np.zeros((4, 5))
    with pytest.raises(BuildError, match="only 5 classes"):
        load_metric("top_k")(outputs, np.zeros(4, dtype=int))
    with pytest.raises(BuildError, match="labels of shape"):
        load_metric("top_2")(outputs, np.zeros((4, 5)))
    with pytest.raises(BuildError, match=r"class indices in \[0, 5\)"):
        load_metric("top_2")(outputs, np.array([0, 1, 7, 2]))


def recipe_with_metric(tmp_path: Path, metric: str) -> Path:
    folder = tmp_path / "digits"
    shutil.copytree(REPO / "recipes" / "digits", folder)
    recipe = folder / "recipe.yaml"
    text = recipe.read_text()
    assert "metric: accuracy" in text
    recipe.write_text(text.replace("metric: accuracy", f"metric: {metric}"))
    return recipe


@pytest.mark.parametrize("metric", ["top_k", "top_3"])
def test_recipes_accept_top_k_forms(tmp_path: Path, metric: str) -> None:
    assert load_recipe(recipe_with_metric(tmp_path, metric)).data.metric == metric


@pytest.mark.parametrize("metric", ["top_0", "top_x", "top3", "top_k5"])
def test_recipes_reject_other_names_listing_the_accepted_forms(tmp_path: Path, metric: str) -> None:
    with pytest.raises(ValidationError) as caught:
        load_recipe(recipe_with_metric(tmp_path, metric))
    message = str(caught.value)
    assert f"(got {metric!r})" in message
    for form in ("'accuracy'", "'mse'", "'top_k' (k = 5)", "'top_<k>' such as 'top_3'", "'file.py:function'"):
        assert form in message, message
