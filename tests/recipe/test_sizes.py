"""One size parser for every size a user writes (budget:, --max-size, DABUILD_MEMORY): binary units, any spelling."""

from __future__ import annotations

import pytest

from dabuild.errors import UsageError
from dabuild.ir.memory import memory_budget
from dabuild.sizes import parse_size


@pytest.mark.parametrize("text, expected", [
    ("0", 0), ("300", 300), (300, 300), ("12B", 12),
    ("10k", 10240), ("64KB", 65536), ("64 KiB", 65536), ("64kb", 65536),
    ("1M", 1024**2), ("1MB", 1024**2), ("1MiB", 1024**2), ("2M", 2 * 1024**2), ("500M", 500 * 1024**2),
    ("1.5GiB", int(1.5 * 1024**3)), ("2G", 2 * 1024**3), ("1T", 1024**4),
])
def test_every_spelling_of_a_unit_is_the_same_power_of_1024(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["lots", "64 furlongs", "1MiBB", "-1M", "M", "", "1.5.2K", True])
def test_what_is_not_a_size_is_refused_naming_it(text: object) -> None:
    with pytest.raises(ValueError, match="is not a size"):
        parse_size(text)  # type: ignore[arg-type]


def test_the_memory_budget_reads_the_same_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DABUILD_MEMORY", "2GB")
    assert memory_budget() == 2 * 1024**3
    monkeypatch.setenv("DABUILD_MEMORY", "plenty")
    with pytest.raises(UsageError, match="DABUILD_MEMORY: 'plenty' is not a size"):
        memory_budget()
    monkeypatch.setenv("DABUILD_MEMORY", "0")
    with pytest.raises(UsageError, match="must be positive"):
        memory_budget()
