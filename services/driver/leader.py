"""Leader election: a lease in the database that expires, plus a fencing epoch.

Every driver campaigns by calling `acquire_leader_lease` every `renew_s`. It
wins only once the holder's lease has expired by the database's clock (the
drivers' clocks are never compared), or at once when the connection the
holder last renewed on has closed (a killed driver's does), and then with
the next epoch. The
leader renews its lease every `renew_s` (`renew_leader_lease`). Every
state-changing driver procedure takes the epoch and refuses a stale one, so
a deposed leader that is still running (paused, partitioned, slow) cannot
write.

Wave 1 held a MySQL named lock on a connection instead: a leader paused by
SIGSTOP kept its connection and so the lock, and no standby ever took over.
A lease runs out by itself.

A leader steps down:
- at once when a renewal is refused: another driver took over (a newer
  epoch), or the lease lapsed. Its loops stop acting (their `epoch()` is
  None), its workers' sessions end with a status naming the new leader if
  known, and its health says NOT_SERVING (`on_deposed`);
- on its own when it cannot renew within the lease length (the database is
  gone or slow, the process was paused): `Leadership.epoch` is None from the
  moment the lease it last proved may have run out. That moment is measured
  on this process's monotonic clock from *before* the renewal was sent, so
  it comes no later than the database's expiry: the leader stops acting
  before a standby can take over, and the fencing epoch covers any call
  already in flight.

A clean shutdown gives the lease up (`resign`) so a standby takes over at
its next look. The election has a database connection of its own, so a
renewal never queues behind the loops for a pooled one. After an election,
and when the database answers again after the leader lost it, the
`Leadership.watching_since_ms` moment moves to now: the dead-worker
detector counts every worker's heartbeat deadline from no earlier than that.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable

from services.db.database import DatabaseConfig, FailedPreconditionError, StaleEpochError
from services.db.store import wall_clock_ms
from services.driver.store import DriverStore

log = logging.getLogger(__name__)

RELEASE_TIMEOUT_S = 5.0
"""How long a resigning driver tries to give its lease up (it expires on its own anyway)."""


@dataclasses.dataclass(frozen=True)
class LeaseSettings:
    """How long leadership lasts unrenewed, and how often it is renewed."""

    lease_s: float = 10.0
    """A renewal holds leadership this long by the database's clock; then a standby may take over. The
    longest a paused or cut-off leader delays failover, and how long the database may be unreachable
    before the leader steps down."""
    renew_s: float = 1.0
    """How often the leader renews, and how often a standby looks whether the lease has run out. At most
    half the lease: several renewals in a row may fail (a slow database) before leadership is lost."""

    def __post_init__(self) -> None:
        if not 0 < 2 * self.renew_s <= self.lease_s:
            raise ValueError(f"renew every {self.renew_s:g} s is not within half a lease of {self.lease_s:g} s")

    @property
    def lease_ms(self) -> int:
        """The lease length in milliseconds, as the procedures take it."""
        return max(1, round(self.lease_s * 1000))


class Leadership:
    """What this driver knows about the election."""

    def __init__(self, name: str, monotonic: Callable[[], float] = time.monotonic):
        self.name = name
        """This driver's advertised address (host:port of its internal listener)."""
        self.held_epoch: int | None = None
        """The epoch this driver won and has not given up (see `epoch`)."""
        self.valid_until = 0.0
        """Monotonic time until which the lease last renewed surely runs."""
        self.known_leader = ""
        """Another driver's address, as last seen leading ('' if none or unknown)."""
        self.elected_at_ms = 0
        """When this driver last won the lease (wall clock)."""
        self.watching_since_ms = 0
        """When this driver last began to see its workers: its election, or the database answering again
        after it lost it while leading (wall clock). No worker's heartbeat deadline runs from before it."""
        self._monotonic = monotonic

    @property
    def epoch(self) -> int | None:
        """The epoch while this driver leads; None while standing by, and None as soon as the lease it
        last proved may have run out, even before the election notices (a paused process wakes up)."""
        if self.held_epoch is not None and self._monotonic() < self.valid_until:
            return self.held_epoch
        return None

    @property
    def leader(self) -> str:
        """The leader's address, as last seen: our own while we lead, '' when unknown."""
        if self.held_epoch is not None:
            return self.name if self.epoch is not None else ""
        return self.known_leader


async def _nothing() -> None:
    return None


class LeaderElection:
    """Campaigns for the lease, renews it while leading, steps down when it cannot (module docstring)."""

    def __init__(self, config: DatabaseConfig, name: str, settings: LeaseSettings = LeaseSettings(),
                 clock_ms: Callable[[], int] = wall_clock_ms, monotonic: Callable[[], float] = time.monotonic):
        self._config = dataclasses.replace(config, pool_size=1)
        self.settings = settings
        self._clock_ms = clock_ms
        self._monotonic = monotonic
        self.state = Leadership(name, monotonic)
        self._store: DriverStore | None = None
        self._database_lost = False
        self._task: asyncio.Task[None] | None = None
        self.step_downs: list[str] = []
        """Why this driver stepped down, each time it did."""

    @property
    def is_leader(self) -> bool:
        return self.state.epoch is not None

    async def run(self, on_elected: Callable[[int], Awaitable[None]], on_deposed: Callable[[], Awaitable[None]],
                  on_database_back: Callable[[], Awaitable[None]] = _nothing) -> None:
        """Campaign and lead until cancelled; call back when this driver starts leading, stops leading,
        and (while leading) when the database answers again after renewals failed. Cancelled, it leaves
        the lease as a dead process would: it runs out (`resign` gives it up)."""
        self._task = asyncio.current_task()
        try:
            while True:
                if self.state.held_epoch is None:
                    await self._campaign(on_elected)
                else:
                    await self._renew(on_deposed, on_database_back)
                pause_s = self.settings.renew_s
                if self.state.held_epoch is not None:  # wake when the lease runs out, to step down then
                    pause_s = min(pause_s, max(0.0, self.state.valid_until - self._monotonic()))
                await asyncio.sleep(pause_s)
        finally:
            await self._close()

    async def _connected(self) -> DriverStore:
        if self._store is None:
            self._store = await DriverStore.connect(self._config, self._clock_ms)
        return self._store

    async def _close(self) -> None:
        store, self._store = self._store, None
        if store is not None:
            await store.close()

    async def _campaign(self, on_elected: Callable[[int], Awaitable[None]]) -> None:
        started = self._monotonic()
        try:
            async with asyncio.timeout(self.settings.lease_s):
                store = await self._connected()
                answer = await store.acquire_leader_lease(self.state.name, self.settings.lease_ms)
        except Exception as e:  # noqa: BLE001 - the election never dies: it logs and looks again
            log.warning("%s: cannot campaign for the leader lease: %r", self.state.name, e)
            await self._close()
            return
        if not answer["elected"]:
            # Our own name: a lease we held still runs by the database's clock although we stopped
            # trusting it (we measure from before each renewal); nobody leads until it runs out.
            holder = answer["leader_name"] or ""
            self.state.known_leader = "" if holder == self.state.name else holder
            return
        epoch = int(answer["epoch"])
        self.state.held_epoch, self.state.valid_until = epoch, started + self.settings.lease_s
        self.state.known_leader = ""
        self.state.elected_at_ms = self.state.watching_since_ms = self._clock_ms()
        self._database_lost = False
        log.info("%s leads with epoch %d (%s; lease %g s, renewed every %g s)", self.state.name, epoch,
                 answer["message"], self.settings.lease_s, self.settings.renew_s)
        await on_elected(epoch)

    async def _renew(self, on_deposed: Callable[[], Awaitable[None]],
                     on_database_back: Callable[[], Awaitable[None]]) -> None:
        epoch = self.state.held_epoch
        assert epoch is not None
        started = self._monotonic()
        if started >= self.state.valid_until:
            await self._step_down(f"could not renew the lease within {self.settings.lease_s:g} s", on_deposed)
            return
        try:
            async with asyncio.timeout(self.state.valid_until - started):
                store = await self._connected()
                await store.renew_leader_lease(epoch, self.settings.lease_ms)
        except (StaleEpochError, FailedPreconditionError) as e:
            await self._step_down(f"the renewal was refused: {e.message}", on_deposed)
            return
        except Exception as e:  # noqa: BLE001 - a lost database; the lease runs out if it stays lost
            self._database_lost = True
            log.warning("%s: renewing the lease failed (%r); it runs %.1f s more", self.state.name, e,
                        max(0.0, self.state.valid_until - self._monotonic()))
            await self._close()
            return
        self.state.valid_until = started + self.settings.lease_s
        if self._database_lost:
            self._database_lost = False
            self.state.watching_since_ms = self._clock_ms()
            log.info("%s: the database answers again; every worker gets a full heartbeat deadline from now",
                     self.state.name)
            await on_database_back()

    async def _step_down(self, why: str, on_deposed: Callable[[], Awaitable[None]]) -> None:
        epoch = self.state.held_epoch
        self.state.held_epoch, self.state.valid_until = None, 0.0
        self.step_downs.append(why)
        log.warning("%s steps down from epoch %s: %s", self.state.name, epoch, why)
        self.state.known_leader = await self._who_leads()
        await on_deposed()

    async def _who_leads(self) -> str:
        """Another driver holding a running lease, '' if none or the database does not answer now."""
        try:
            async with asyncio.timeout(self.settings.renew_s):
                store = await self._connected()
                holder = await store.lease_holder()
        except Exception as e:  # noqa: BLE001 - only a hint for the workers sent away
            log.info("%s: cannot tell who leads now: %r", self.state.name, e)
            await self._close()
            return ""
        return "" if holder is None or holder == self.state.name else holder  # our own lapsed lease: nobody leads yet

    async def resign(self) -> None:
        """Stop campaigning and give the lease up (clean shutdown): a standby takes over at its next look,
        not after the lease length."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        epoch = self.state.held_epoch
        self.state.held_epoch, self.state.valid_until = None, 0.0
        if epoch is None:
            return
        try:
            async with asyncio.timeout(RELEASE_TIMEOUT_S):
                store = await self._connected()
                await store.release_leader_lease(epoch)
            log.info("%s gave up the lease of epoch %d", self.state.name, epoch)
        except Exception as e:  # noqa: BLE001 - it runs out on its own
            log.warning("%s: could not give up the lease of epoch %d (%r); it runs out within %g s",
                        self.state.name, epoch, e, self.settings.lease_s)
        finally:
            await self._close()
