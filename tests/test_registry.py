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
