"""Fixtures of the recipe and capability tests."""

from __future__ import annotations

import pytest

from dabuild.capability import ENV_PATH


@pytest.fixture(autouse=True)
def no_env_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """No capability folder from the environment: the tests say which capabilities exist."""
    monkeypatch.delenv(ENV_PATH, raising=False)
