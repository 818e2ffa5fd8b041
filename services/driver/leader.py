"""Leader election: a MySQL named lock plus a fencing epoch.

Every driver tries `GET_LOCK('corral_driver_leader', 0)` on a connection of
its own. The server gives the lock to one connection at a time and releases
it the moment that connection ends, so a leader that crashes or loses the
database is replaced within one poll period. The winner then calls
`elect_leader`, which increments the epoch; every state-changing driver
procedure takes the epoch and refuses a stale one, so a deposed leader
that is still running (a long GC pause, a partition) cannot write.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable

import aiomysql
import pymysql

from services.db.database import DatabaseConfig
from services.db.store import JobStore

log = logging.getLogger(__name__)

LOCK_NAME = "corral_driver_leader"


@dataclasses.dataclass
class Leadership:
    """What this driver knows about the election."""

    name: str
    """This driver's advertised address (host:port of its internal listener)."""
    epoch: int | None = None
    """The epoch while we lead; None while standing by."""
    leader: str = ""
    """The leader's advertised address, as last seen (our own while we lead)."""


class LeaderElection:
    """Campaigns for leadership and keeps it while the lock connection lives."""

    def __init__(self, config: DatabaseConfig, store: JobStore, name: str, poll_s: float = 1.0):
        self._config = config
        self._store = store
        self.state = Leadership(name)
        self._poll_s = poll_s
        self._conn: aiomysql.Connection | None = None

    @property
    def is_leader(self) -> bool:
        return self.state.epoch is not None

    async def _connect(self) -> aiomysql.Connection:
        kwargs = self._config.connect_kwargs()
        kwargs.pop("init_command", None)
        return await aiomysql.connect(**kwargs)

    async def _holds_lock(self) -> bool:
        assert self._conn is not None
        async with self._conn.cursor() as cursor:
            await cursor.execute("SELECT IS_USED_LOCK(%s) = CONNECTION_ID()", (LOCK_NAME,))
            (held,) = await cursor.fetchone()
        return bool(held)

    async def _current_leader(self) -> str:
        assert self._conn is not None
        async with self._conn.cursor() as cursor:
            await cursor.execute("SELECT leader_name FROM leader_epoch")
            (name,) = await cursor.fetchone()
        return name or ""

    async def _try_acquire(self) -> bool:
        if self._conn is None:
            self._conn = await self._connect()
        async with self._conn.cursor() as cursor:
            await cursor.execute("SELECT GET_LOCK(%s, 0)", (LOCK_NAME,))
            (got,) = await cursor.fetchone()
        return got == 1

    async def run(self, on_elected: Callable[[int], Awaitable[None]],
                  on_deposed: Callable[[], Awaitable[None]]) -> None:
        """Campaign forever; call back when this driver starts and stops leading."""
        try:
            while True:
                try:
                    if not self.is_leader:
                        if await self._try_acquire():
                            self.state.epoch = await self._store.elect_leader(self.state.name)
                            self.state.leader = self.state.name
                            log.info("%s leads with epoch %d", self.state.name, self.state.epoch)
                            await on_elected(self.state.epoch)
                        else:
                            self.state.leader = await self._current_leader()
                    elif not await self._holds_lock():
                        raise ConnectionError("the leader lock was lost")
                except (pymysql.MySQLError, ConnectionError, OSError) as e:
                    log.warning("%s: leader connection failed: %s", self.state.name, e)
                    await self._drop_connection()
                    if self.is_leader:
                        self.state.epoch = None
                        await on_deposed()
                await asyncio.sleep(self._poll_s)
        finally:
            await self._drop_connection()

    async def _drop_connection(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None

    async def resign(self) -> None:
        """Give the lock up now (clean shutdown), so a standby takes over at once."""
        await self._drop_connection()
        self.state.epoch = None
