"""`dabuild validate` checks the data against the model's inputs without tracing where they are known (an .onnx
file's graph inputs, or `model.inputs`), at the recipe's lines; what it cannot know it says."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from support import copy_recipes

from dabuild.cli import main


def edit(recipe_dir: Path, old: str, new: str) -> None:
    path = recipe_dir / "recipe.yaml"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def validate(recipe_dir: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["validate", str(recipe_dir)])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_a_wrong_input_name_fails_validation_at_its_line(digits: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, output = validate(digits, capsys)
    assert code == 0 and "data checked against the model's inputs" in output
    edit(digits, "{source: data.npz, x: x_test, y: y_test}", "{source: data.npz, x: {image: x_test}, y: y_test}")
    code, output = validate(digits, capsys)
    assert code == 2
    assert re.search(r"recipe\.yaml:\d+:\d+: maps inputs image, but the model's inputs are x", output)


def test_data_of_the_wrong_shape_fails_validation(digits: Path, capsys: pytest.CaptureFixture[str]) -> None:
    arrays = dict(np.load(digits / "data.npz"))
    arrays["x_test"] = arrays["x_test"][:, :60]
    np.savez(digits / "data.npz", **arrays)
    code, output = validate(digits, capsys)
    assert code == 2
    assert re.search(r"recipe\.yaml:\d+:\d+: array 'x_test' has samples of shape \[60\], but model input 'x' "
                     r"takes 64$", output, re.MULTILINE), output


def test_channels_last_data_gets_a_hint_to_transpose(digits: Path, capsys: pytest.CaptureFixture[str]) -> None:
    arrays = dict(np.load(digits / "data.npz"))
    for key in ("x_train", "x_test"):
        arrays[key] = arrays[key].reshape(-1, 8, 8, 1)
    np.savez(digits / "data.npz", **arrays)
    edit(digits, "inputs: {x: [null, 64]}", "inputs: {x: [null, 1, 8, 8]}")
    code, output = validate(digits, capsys)
    assert code == 2
    assert ("has samples of shape [8, 8, 1], but model input 'x' takes 1x8x8 (channels last? the model takes "
            "channels first: store np.transpose(x, (0, 3, 1, 2))") in output


def test_an_onnx_models_inputs_are_read_without_tracing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("onnx")
    folder = copy_recipes(tmp_path, "digits", "digits-onnx") / "digits-onnx"
    code, output = validate(folder, capsys)
    assert code == 0 and "data checked against the model's inputs" in output
    edit(folder, "x: x_train, samples: 512", "x: {pixels: x_train}, samples: 512")
    code, output = validate(folder, capsys)
    assert code == 2 and re.search(r"maps inputs pixels, but the model's inputs are \w+", output), output


def test_validate_says_what_needs_the_traced_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = copy_recipes(tmp_path, "digits", "digits-torch") / "digits-torch"
    edit(folder, "  inputs: {x: [null, 64]}\n", "")
    code, output = validate(folder, capsys)
    assert code == 0 and "the data's input names and shapes need the traced model" in output
