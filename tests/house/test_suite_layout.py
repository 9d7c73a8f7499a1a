"""The suite's layout holds: every folder of tests is on pytest's pythonpath (so any folder runs alone and
imports another's helpers by module name), and no two test files share a name (prepend imports by name)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from support import REPO

TESTS = REPO / "tests"


def test_every_folder_of_tests_is_on_the_pythonpath(pytestconfig: pytest.Config) -> None:
    listed = {Path(path).resolve() for path in pytestconfig.getini("pythonpath")}
    folders = {path.parent.resolve() for path in TESTS.rglob("test_*.py")} | {TESTS.resolve()}
    assert sorted(map(str, folders - listed)) == [], "add them to [tool.pytest.ini_options] pythonpath"


def test_no_two_test_files_share_a_name() -> None:
    folders = {path.parent for path in TESTS.rglob("test_*.py")} | {TESTS}
    names = Counter(path.name for folder in folders for path in folder.glob("*.py") if path.name != "conftest.py")
    assert [name for name, count in names.items() if count > 1] == []


def test_no_test_file_is_left_at_the_top() -> None:
    assert sorted(path.name for path in TESTS.glob("test_*.py")) == [], "tests live in a feature folder"
