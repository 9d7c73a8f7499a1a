"""The repository's commit-msg hook holds commit messages to the house rule (72-character subject, blank line)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

HOOK = Path(__file__).resolve().parents[2] / ".githooks" / "commit-msg"


def _hook(tmp_path: Path, message: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("sh") is None:
        pytest.skip("no sh to run the hook with")
    file = tmp_path / "COMMIT_EDITMSG"
    file.write_text(message, encoding="utf-8")
    return subprocess.run(["sh", str(HOOK), str(file)], capture_output=True, text=True, check=False)


def test_a_subject_of_72_characters_with_a_body_passes(tmp_path: Path) -> None:
    result = _hook(tmp_path, "x" * 72 + "\n\nWhy: a body after a blank line.\n# git's comment " + "y" * 100 + "\n")
    assert result.returncode == 0, result.stderr


def test_a_subject_over_72_characters_is_rejected_saying_its_length(tmp_path: Path) -> None:
    result = _hook(tmp_path, "x" * 73 + "\n")
    assert result.returncode == 1 and "73 characters" in result.stderr


def test_a_body_must_follow_a_blank_line(tmp_path: Path) -> None:
    result = _hook(tmp_path, "Short subject\nbody straight after\n")
    assert result.returncode == 1 and "blank" in result.stderr


def test_an_empty_subject_is_rejected(tmp_path: Path) -> None:
    assert _hook(tmp_path, "# only comments\n").returncode == 1
