"""Errors that reach the user, each carrying the process exit code it maps to.

Exit codes follow make's spirit: 0 ok, 1 a build or check failed, 2 the user
asked for something invalid (bad recipe, bad flags, unknown names).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


class DabuildError(Exception):
    """A failure with a message fit for the user; `exit_code` tells the CLI what to return."""

    exit_code = 1


class BuildError(DabuildError):
    """A stage could not produce its outputs."""

    exit_code = 1


class CheckError(BuildError):
    """An artifact ran in its runtime but disagreed with dabuild's reference."""


class UsageError(DabuildError):
    """The user asked for something invalid: bad flags, bad names, bad files."""

    exit_code = 2


@dataclass(frozen=True)
class Diagnostic:
    """One problem at one place of one file, printed as `file:line:col: message`."""

    file: Path | str
    line: int | None
    col: int | None
    message: str

    def __str__(self) -> str:
        where = str(self.file)
        if self.line is not None:
            where += f":{self.line}"
            if self.col is not None:
                where += f":{self.col}"
        return f"{where}: {self.message}"


class ValidationError(UsageError):
    """Every problem found in an input file, reported together."""

    def __init__(self, diagnostics: list[Diagnostic]):
        self.diagnostics = sorted(
            diagnostics, key=lambda d: (str(d.file), d.line or 0, d.col or 0)
        )
        super().__init__("\n".join(str(d) for d in self.diagnostics))


def unknown_name_message(what: str, name: str, available: Iterable[str]) -> str:
    """`unknown strategy 'basc' (did you mean 'basic'?); available: basic, ...`."""
    names = sorted(available)
    message = f"unknown {what} {name!r}"
    close = difflib.get_close_matches(name, names, n=1)
    if close:
        message += f" (did you mean {close[0]!r}?)"
    return message + "; available: " + (", ".join(names) or "none")
