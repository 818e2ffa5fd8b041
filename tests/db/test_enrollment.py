"""enroll_instance: a pending instance's one-time activation token enrolls once, within its time to live,
compared byte for byte (the column's collation would take 'token ' for 'token')."""

from __future__ import annotations

import asyncio

import pytest

from services.db.database import PermissionDeniedError
from tests.world import World

TTL_MS = 900_000


async def test_a_token_enrolls_once_within_its_time_to_live(world: World) -> None:
    await world.store.create_instance(world.epoch, "i1", "standard", 1000, "tok-i1")
    await world.store.create_instance(world.epoch, "i2", "standard", 1000, "tok-i2")
    for token in ("tok-i1 ", "TOK-I1", "tok-i", "tok-i2"):
        with pytest.raises(PermissionDeniedError):
            await world.store.enroll_instance("i1", token, TTL_MS)
    world.clock.advance(TTL_MS - 1)
    await world.store.enroll_instance("i1", "tok-i1", TTL_MS)  # the last moment it may
    world.clock.advance(1)
    with pytest.raises(PermissionDeniedError):
        await world.store.enroll_instance("i1", "tok-i1", TTL_MS)  # used
    with pytest.raises(PermissionDeniedError):
        await world.store.enroll_instance("i2", "tok-i2", TTL_MS)  # expired
    row = await world.db.fetchone("SELECT time_enrolled_ms FROM instances WHERE name = 'i1'")
    assert row is not None and row["time_enrolled_ms"] == world.clock() - 1


async def test_concurrent_enrollments_consume_the_token_once(world: World) -> None:
    await world.store.create_instance(world.epoch, "i1", "standard", 1000, "tok-i1")

    async def attempt(i: int) -> bool:
        world.clock.advance(1)  # each call writes a different time: a repeat would change the row
        try:
            await world.store.enroll_instance("i1", "tok-i1", TTL_MS)
        except PermissionDeniedError:
            return False
        return True

    assert sum(await asyncio.gather(*(attempt(i) for i in range(20)))) == 1


async def test_an_active_or_deactivated_instance_enrolls_nothing(world: World) -> None:
    await world.instance("i1")  # activated (with its token) without enrolling: a local worker
    with pytest.raises(PermissionDeniedError):
        await world.store.enroll_instance("i1", "tok-i1", TTL_MS)
    await world.store.create_instance(world.epoch, "i2", "standard", 1000, "tok-i2")
    await world.store.deactivate_instance(world.epoch, "i2", "deleted")
    with pytest.raises(PermissionDeniedError):
        await world.store.enroll_instance("i2", "tok-i2", TTL_MS)
