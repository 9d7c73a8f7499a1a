"""Malformed input of every class ends in a clear error at the recipe's line (exit 2), never a traceback or hang.

Two corpora, in the manner of tests/recipe/test_recipe_errors.py (`# expect: LINE:COL: message`, "..." matching any
ending):

- corpus/special/: recipes naming special files and odd paths. Git cannot hold a FIFO, a device, a symlink
  loop or a folder named like a file, so `# setup: KIND NAME [TARGET]` lines make them in a private copy:
  `fifo NAME`, `dir NAME`, `loop NAME` (a link to itself), `link NAME TARGET`.
- corpus/builds/: recipes that validate but whose data or `tuning.space` contradict the traced model; they
  are built (cache off) and must stop after `trace` with exit 2.

Each case runs under an alarm: a hang fails the test instead of stalling the suite.
"""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from dabuild.cli import main
from dabuild.errors import ValidationError
from dabuild.recipe import load_recipe

CORPUS = Path(__file__).resolve().parents[1] / "corpus"
EXPECT, SETUP = "# expect: ", "# setup: "


@contextmanager
def deadline(seconds: int) -> Iterator[None]:
    def expired(signum: int, frame: object) -> None:
        raise TimeoutError(f"still running after {seconds}s: a hang")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _lines(path: Path, prefix: str) -> list[str]:
    return [line[len(prefix):] for line in path.read_text().splitlines() if line.startswith(prefix)]


def _matches(expected: list[str], reported: list[str]) -> None:
    assert len(reported) == len(expected), reported
    for want, got in zip(expected, reported, strict=True):
        assert got.startswith(want[:-3]) if want.endswith("...") else got == want, f"got {got!r}"


def _private_copy(case: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "case"
    shutil.copytree(case.parent, folder, ignore=shutil.ignore_patterns("*.yaml"))
    shutil.copy(case, folder / case.name)
    for setup in _lines(case, SETUP):
        kind, name, *target = setup.split()
        path = folder / name
        path.unlink(missing_ok=True)
        if kind == "fifo":
            os.mkfifo(path)
        elif kind == "dir":
            path.mkdir()
        elif kind == "loop":
            path.symlink_to(path.name)
        elif kind == "link":
            path.symlink_to(target[0])
        else:
            raise AssertionError(f"{case}: unknown setup {kind!r}")
    return folder / case.name


SPECIAL = sorted(CORPUS.glob("special/*.yaml"))
BUILDS = sorted(CORPUS.glob("builds/*.yaml"))


@pytest.mark.parametrize("case", SPECIAL, ids=lambda p: p.stem)
def test_special_files_and_odd_paths_are_validation_errors(case: Path, tmp_path: Path) -> None:
    recipe = _private_copy(case, tmp_path)
    with deadline(20), pytest.raises(ValidationError) as caught:
        load_recipe(recipe)
    _matches(_lines(case, EXPECT), [str(d)[len(str(recipe)) + 1:] for d in caught.value.diagnostics])


@pytest.mark.parametrize("case", BUILDS, ids=lambda p: p.stem)
def test_data_that_contradicts_the_model_stops_the_build_at_its_line(case: Path, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture) -> None:
    recipe = _private_copy(case, tmp_path)
    with deadline(120):
        code = main(["build", str(recipe), "--build-dir", str(tmp_path / "build"), "--no-cache", "-q"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    lines = [line.removeprefix("dabuild: error: ") for line in err.splitlines()]
    reported = [line[len(str(recipe)) + 1:] for line in lines if line.startswith(f"{recipe}:")]
    _matches(_lines(case, EXPECT), reported)
    assert not (tmp_path / "build" / "corpus" / "calibrate").exists()  # stopped before any stage but trace


def test_the_corpora_cover_every_class() -> None:
    assert len(SPECIAL) >= 8 and len(BUILDS) >= 10


def test_a_fifo_as_the_recipe_is_refused_without_opening_it(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    os.mkfifo(tmp_path / "recipe.yaml")
    with deadline(20):
        assert main(["validate", str(tmp_path / "recipe.yaml")]) == 2
    assert "FIFO" in capsys.readouterr().err
