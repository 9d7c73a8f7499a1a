"""The one registry type every per-op table uses (IR ops, lowerings, kernels, exporters, converters).

A registry maps a name (an op, an ONNX op type, an ATen op) to what handles
it. It refuses a second entry under a name it holds, so two modules cannot
silently overwrite each other, lists its names for errors and for the
coverage table (docs/ops.md), and says which names it has when asked for one
it lacks.

A registry filled by decorators in other modules names them (`modules`): it
imports them on its first lookup, as onnx's reference evaluator builds its op
list (`load_op`), so nothing imports a module only to fill a table, and a
table whose modules need an optional dependency (`extra`) says which extra to
install when it is first looked at, not when dabuild is imported.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import ModuleType
from typing import Generic, TypeVar

from dabuild.errors import BuildError

T = TypeVar("T")
F = TypeVar("F")
E = TypeVar("E")


def import_extra(module: str, extra: str | None, where: str) -> ModuleType:
    """Import `module`; a package it needs that is missing is a BuildError naming the dabuild extra that
    installs it (`where` says who needs it), not an ImportError deep in a traceback."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        package = (error.name or "").split(".")[0]
        if extra is None or package in ("", "dabuild"):
            raise
        raise BuildError(f"{where} needs the Python package {package!r}, which is not installed; "
                         f"install it with `pip install dabuild[{extra}]`") from error


class DuplicateEntry(ValueError):
    """A second registration under a name the registry already holds (a programming error)."""


class MissingEntry(KeyError):
    """A lookup of a name the registry does not hold; its message lists the names it does."""

    def __str__(self) -> str:
        return str(self.args[0])


class Registry(Generic[T]):
    """Name -> entry, filled by decorators in `modules`; `what` and `where` make its messages read well.

    `Registry("converter", "the onnx frontend")` answers a missing name with
    "no converter for op 'Foo' in the onnx frontend; available: ...".
    """

    def __init__(self, what: str, where: str, modules: Sequence[str] = (), extra: str | None = None) -> None:
        self.what = what
        self.where = where
        self._entries: dict[str, T] = {}
        self._modules = tuple(modules)  # imported on the first lookup: their decorators fill this table
        self._extra = extra              # the dabuild extra that installs what those modules import
        self._loaded = not self._modules

    def _table(self) -> dict[str, T]:
        """The entries, after importing `modules` on the first lookup (BuildError naming the extra to install
        when one needs a package that is missing)."""
        if not self._loaded:
            self._loaded = True  # first: a module may look a name up while it registers
            try:
                for module in self._modules:
                    import_extra(module, self._extra, self.where)
            except (ImportError, BuildError):
                self._loaded = False
                raise
        return self._entries

    def add(self, name: str, entry: T) -> None:
        """Register `entry` under `name`; DuplicateEntry if the name is taken."""
        if name in self._entries:
            raise DuplicateEntry(f"{self.where} already has a {self.what} for {name!r}")
        self._entries[name] = entry

    def register(self, *names: str) -> Callable[[F], F]:
        """Decorator registering the decorated object under each of `names`."""
        def decorate(entry: F) -> F:
            for name in names:
                self.add(name, entry)  # type: ignore[arg-type]
            return entry
        return decorate

    def missing(self, name: str) -> str:
        """The message for a lookup of `name`, which the registry lacks."""
        return f"no {self.what} for op {name!r} in {self.where}; available: {', '.join(self.names()) or 'none'}"

    def __getitem__(self, name: str) -> T:
        try:
            return self._table()[name]
        except KeyError:
            raise MissingEntry(self.missing(name)) from None

    def typed(self, name: str, kind: type[E]) -> E:
        """The entry for `name` as a `kind`, for callers that use what only that subclass has (a pool's geometry)."""
        entry = self[name]
        if not isinstance(entry, kind):
            raise TypeError(f"{self.what} {name!r} is a {type(entry).__name__}, not a {kind.__name__}")
        return entry

    def get(self, name: str, default: T | None = None) -> T | None:
        return self._table().get(name, default)

    def __contains__(self, name: object) -> bool:
        return name in self._table()

    def __iter__(self) -> Iterator[str]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())

    def names(self) -> list[str]:
        """Every registered name, sorted."""
        return sorted(self._table())

    def items(self) -> list[tuple[str, T]]:
        return list(self._table().items())

    def values(self) -> list[T]:
        return list(self._table().values())

    @contextmanager
    def without(self, *names: str) -> Iterator[None]:
        """The registry with `names` taken out for the duration (how tests reach a stage's "no entry" path)."""
        taken = {name: self._table().pop(name) for name in names}
        try:
            yield
        finally:
            self._entries.update(taken)
