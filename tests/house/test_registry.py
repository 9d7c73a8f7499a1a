"""The one registry type: duplicates refused, names listed, a missing name answered with what exists."""

from __future__ import annotations

import pytest

from dabuild.registry import DuplicateEntry, MissingEntry, Registry


def test_a_second_entry_under_a_name_is_refused() -> None:
    table: Registry[int] = Registry("kernel", "the test target")
    table.add("conv", 1)
    with pytest.raises(DuplicateEntry, match="the test target already has a kernel for 'conv'"):
        table.add("conv", 2)
    assert table["conv"] == 1


def test_decorator_registers_under_every_name_in_order() -> None:
    table: Registry[object] = Registry("converter", "a frontend")

    @table.register("Relu", "Clip")
    def convert() -> None:
        return None

    assert table.names() == ["Clip", "Relu"]
    assert list(table) == ["Relu", "Clip"]
    assert table["Clip"] is convert and "Relu" in table and len(table) == 2


def test_a_missing_name_lists_the_available_ones() -> None:
    table: Registry[int] = Registry("C kernel", "the c target")
    table.add("dense", 1)
    table.add("conv", 2)
    with pytest.raises(MissingEntry) as caught:
        table["lrn"]
    assert str(caught.value) == "no C kernel for op 'lrn' in the c target; available: conv, dense"
    assert table.get("lrn") is None


def test_without_takes_names_out_for_a_while() -> None:
    table: Registry[int] = Registry("writer", "the test target")
    table.add("a", 1)
    with table.without("a"):
        assert "a" not in table
    assert table["a"] == 1


def test_typed_returns_the_entry_as_the_subclass_asked_for_or_names_both() -> None:
    from dabuild.ir.ops import OPS
    from dabuild.ir.ops.pool import AvgPool, Pool

    assert isinstance(OPS.typed("avg_pool", Pool), AvgPool)
    with pytest.raises(TypeError, match="IR op 'relu' is a .*, not a Pool"):
        OPS.typed("relu", Pool)


def test_a_registry_imports_its_modules_on_the_first_lookup(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The modules a registry names fill it when it is first looked at, not when it is made or imported."""
    import sys

    table: Registry[int] = Registry("op", "a lazy table", ["lazy_fill_ops"])
    (tmp_path / "lazy_fill_ops.py").write_text(f"import {__name__} as tests\ntests.LAZY.add('relu', 1)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys.modules[__name__], "LAZY", table, raising=False)
    assert "lazy_fill_ops" not in sys.modules
    assert table["relu"] == 1 and table.names() == ["relu"]
    assert "lazy_fill_ops" in sys.modules
    monkeypatch.delitem(sys.modules, "lazy_fill_ops")


def test_a_missing_optional_dependency_fails_at_lookup_naming_the_extra(tmp_path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from dabuild.errors import BuildError

    (tmp_path / "needs_absent_package.py").write_text("import dabuild_absent_package_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    table: Registry[int] = Registry("converter", "the toy frontend", ["needs_absent_package"], extra="toy")
    with pytest.raises(BuildError, match=r"the toy frontend needs the Python package 'dabuild_absent_package_xyz', "
                                         r"which is not installed; install it with `pip install dabuild\[toy\]`"):
        table.get("Relu")
    with pytest.raises(BuildError):  # still not loaded: asked again, it says the same
        "Relu" in table  # noqa: B015
