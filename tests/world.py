"""A driver's world for tests: a store with a controllable clock, a leader
epoch, active instances, and a one-call batch builder."""

from __future__ import annotations

import itertools
from typing import Any

from services.db.database import Database
from services.driver.store import DriverStore


class FakeClock:
    """Milliseconds that only move when a test moves them."""

    def __init__(self, start_ms: int = 1_700_000_000_000):
        self.now_ms = start_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> int:
        self.now_ms += ms
        return self.now_ms


class World:
    """A driver's store plus the usual fixtures of a driver's world."""

    def __init__(self, db: Database, store: DriverStore, clock: FakeClock):
        self.db = db
        self.store = store
        self.clock = clock
        self.epoch = 0
        self._attempts = itertools.count(1)

    def attempt_id(self) -> str:
        return f"a{next(self._attempts)}"

    async def setup(self) -> World:
        await self.store.create_billing_project("proj", ["alice", "bob"])
        self.epoch = await self.store.elect_leader("driver-0")
        return self

    async def instance(self, name: str = "i1", cores_mcpu: int = 1_000_000, inst_coll: str = "standard") -> str:
        await self.store.create_instance(self.epoch, name, inst_coll, cores_mcpu, f"tok-{name}")
        await self.store.activate_instance(self.epoch, name, f"tok-{name}")
        return name

    async def batch(
        self,
        jobs: list[dict[str, Any]],
        user: str = "alice",
        groups: list[dict[str, Any]] | None = None,
        commit: bool = True,
        **batch_kwargs: Any,
    ) -> tuple[int, int, int]:
        """Create a batch with one update holding `jobs` (ids filled in order).

        Returns (batch_id, update_id, start_job_id)."""
        created = await self.store.create_batch(user, "proj", **batch_kwargs)
        batch_id = int(created["batch_id"])
        update = await self.store.create_update(batch_id, len(jobs), len(groups or []))
        start = int(update["start_job_id"])
        if groups:
            await self.store.insert_job_groups(batch_id, update["update_id"], groups)
        if jobs:
            full = [job_spec(start + i, **job) for i, job in enumerate(jobs)]
            await self.store.insert_jobs(batch_id, update["update_id"], full)
        if commit:
            await self.store.commit_update(batch_id, update["update_id"])
        return batch_id, int(update["update_id"]), start

    async def job(self, batch_id: int, job_id: int) -> dict[str, Any]:
        row = await self.db.fetchone("SELECT * FROM jobs WHERE batch_id = %s AND job_id = %s", (batch_id, job_id))
        assert row is not None
        return row

    async def state(self, batch_id: int, job_id: int) -> str:
        return (await self.job(batch_id, job_id))["state"]

    async def batch_row(self, batch_id: int) -> dict[str, Any]:
        row = await self.db.fetchone("SELECT * FROM batches WHERE batch_id = %s", (batch_id,))
        assert row is not None
        return row

    async def run(self, batch_id: int, job_id: int, instance: str = "i1", instance_products: bool = False) -> str:
        """SJ + MJS (`instance_products`: billed to the instance's products, as the driver does); returns the
        attempt id."""
        attempt = self.attempt_id()
        outcome = await self.store.schedule_jobs(
            self.epoch, instance, [{"batch_id": batch_id, "job_id": job_id, "attempt_id": attempt}]
        )
        assert outcome[0]["outcome"] == "scheduled", outcome
        await self.store.mark_jobs_started(
            self.epoch, instance,
            [{"batch_id": batch_id, "job_id": job_id, "attempt_id": attempt, "start_time_ms": self.clock()}],
            instance_products=instance_products,
        )
        return attempt

    async def finish(self, batch_id: int, job_id: int, attempt: str | None, state: str, instance: str | None = "i1") -> str:
        """MJC for one job; returns the outcome."""
        result = await self.store.mark_jobs_complete(
            self.epoch, instance,
            [{"batch_id": batch_id, "job_id": job_id, "attempt_id": attempt, "state": state,
              "exit_code": 0 if state == "Success" else 1, "start_time_ms": self.clock(),
              "end_time_ms": self.clock()}],
        )
        return result[0]["outcome"]

    async def drain(self, batch_id: int) -> int:
        """Run the canceller's drain until nothing more is cancelled."""
        total = 0
        while n := await self.store.cancel_ready_jobs(self.epoch, batch_id, 300):
            total += n
        return total


def job_spec(job_id: int, **overrides: Any) -> dict[str, Any]:
    """A job row for insert_jobs with sensible defaults."""
    spec: dict[str, Any] = {"job_id": job_id, "cores_mcpu": 1000, "inst_coll": "standard", "job_group_id": 0}
    spec.update(overrides)
    return spec
