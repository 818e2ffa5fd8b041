"""Procedure-level tests use the `world` and `clock` fixtures of tests/conftest.py
(the helpers behind them are in tests/world.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

import pytest

from services.db.database import Database, DatabaseConfig


@pytest.fixture
async def one_connection(db_config: DatabaseConfig) -> AsyncIterator[Database]:
    """A pool of exactly one connection, so the next call gets the same one if it is pooled."""
    database = await Database.connect(dataclasses.replace(db_config, pool_size=1))
    try:
        yield database
    finally:
        await database.close()
