"""Every malformed file under tests/corpus/ must fail with exactly the diagnostics it announces.

Each corpus file starts with `# expect: LINE:COL: message` lines, one per
diagnostic, in the order they are reported; adding a case is adding a file.
A message ending in "..." matches any ending: lists of installed plugins and
capabilities grow as dabuild does.
Files under corpus/recipes/ are loaded as recipes, under corpus/capabilities/
as capability files.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dabuild.capability import load_capability
from dabuild.errors import UsageError, ValidationError
from dabuild.recipe import load_recipe

CORPUS = Path(__file__).resolve().parents[1] / "corpus"
CASES = sorted(CORPUS.glob("recipes/*.yaml")) + sorted(CORPUS.glob("capabilities/*.yaml"))
EXPECT = "# expect: "


def expected_lines(path: Path) -> list[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [line[len(EXPECT) :] for line in lines if line.startswith(EXPECT)]


def reported_lines(path: Path) -> list[str]:
    load = load_recipe if path.parent.name == "recipes" else load_capability
    with pytest.raises(ValidationError) as caught:
        load(path)
    for diagnostic in caught.value.diagnostics:
        assert diagnostic.file == str(path)
    return [str(d)[len(str(path)) + 1 :] for d in caught.value.diagnostics]


def test_corpus_is_large_enough() -> None:
    assert len(CASES) >= 25


@pytest.mark.parametrize("path", CASES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_corpus_file_reports_exactly_its_expected_diagnostics(path: Path) -> None:
    expected = expected_lines(path)
    assert expected, f"{path} announces no `{EXPECT}` line"
    reported = reported_lines(path)
    assert len(reported) == len(expected), reported
    for want, got in zip(expected, reported):
        assert got.startswith(want[:-3]) if want.endswith("...") else got == want, f"got {got!r}"


def test_one_file_reports_all_of_its_problems_at_once() -> None:
    path = CORPUS / "recipes" / "several_errors.yaml"
    with pytest.raises(ValidationError) as caught:
        load_recipe(path)
    reported = caught.value.diagnostics
    assert len(reported) == len(expected_lines(path)) >= 8
    assert len({d.line for d in reported}) >= 7  # spread over the file, not stuck on the first problem
    text = str(caught.value)
    assert text.splitlines()[0].startswith(f"{path}:")
    assert caught.value.exit_code == UsageError.exit_code == 2


def test_missing_recipe_file_is_a_validation_error(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="file not found"):
        load_recipe(tmp_path / "recipe.yaml")
