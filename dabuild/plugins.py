"""Plugin discovery through entry points: the built-ins register exactly like third parties.

Names are listed without importing the plugin modules, so validating a recipe
stays cheap; a class is imported only when it is used.
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from dabuild import errors
from dabuild.errors import UsageError

TRACERS = "dabuild.tracers"
TARGETS = "dabuild.targets"
STRATEGIES = "dabuild.strategies"

_WHAT = {TRACERS: "framework", TARGETS: "target kind", STRATEGIES: "strategy"}


@cache
def _entry_points(group: str) -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=group)}


def available(group: str) -> list[str]:
    """Sorted names registered in an entry-point group."""
    return sorted(_entry_points(group))


def unknown_name_message(group: str, name: str) -> str:
    """`unknown strategy 'basc' (did you mean 'basic'?); available: basic, ...`."""
    return errors.unknown_name_message(_WHAT.get(group, group), name, available(group))


def module_of(group: str, name: str) -> str:
    """The module that defines plugin `name` of `group`, read from its entry point without importing it:
    a stage's key digests that module's code (pipeline/code_digest.py)."""
    eps = _entry_points(group)
    if name not in eps:
        raise UsageError(unknown_name_message(group, name))
    return eps[name].module


def load(group: str, name: str) -> Any:
    """The object registered as `name` in `group`; UsageError listing the alternatives."""
    eps = _entry_points(group)
    if name not in eps:
        raise UsageError(unknown_name_message(group, name))
    return eps[name].load()
