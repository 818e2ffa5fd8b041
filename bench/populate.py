"""Building the state a benchmark measures, quickly and through the real
procedures: committed batches of Ready jobs, inserted in parallel bunches
with `JobStore` exactly as the frontend inserts them (minus the gRPC hop
and the spec storage, which only `submit` measures).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

from bench.common import progress
from services.db.store import JobStore

INSERT_BUNCH = 5000
"""Jobs per insert_jobs call: the frontend's largest bunch (services/frontend/limits.py)."""
PARALLEL_BUNCHES = 4
"""Bunches in flight at once; ids come from the update's block, so they do not contend."""


@dataclasses.dataclass(frozen=True)
class ReadyBatch:
    """A committed batch whose jobs are all Ready."""

    batch_id: int
    user: str
    start_job_id: int
    n_jobs: int

    @property
    def job_ids(self) -> range:
        return range(self.start_job_id, self.start_job_id + self.n_jobs)


@dataclasses.dataclass(frozen=True)
class JobShape:
    """What every job of a populated batch asks for."""

    inst_coll: str = "standard"
    """The pool it runs in."""
    cores_mcpu: int = 1000
    """Cores it asks for."""
    priority: int = 0
    """Its priority (higher: earlier in its user's queue)."""


async def ready_batch(store: JobStore, user: str, billing_project: str, n_jobs: int,
                      shapes: tuple[JobShape, ...] = (JobShape(),), parallel: int = PARALLEL_BUNCHES,
                      bunch: int = INSERT_BUNCH, quiet: bool = False) -> ReadyBatch:
    """Create a batch of `n_jobs` no-op jobs, insert them in parallel bunches
    and commit: every job is Ready. Job i gets `shapes[i % len(shapes)]`."""
    started = time.perf_counter()
    batch_id = int((await store.create_batch(user, billing_project))["batch_id"])
    update = await store.create_update(batch_id, n_jobs)
    update_id, start = int(update["update_id"]), int(update["start_job_id"])
    limit = asyncio.Semaphore(parallel)

    async def insert(first: int) -> None:
        rows = []
        for job_id in range(start + first, start + min(first + bunch, n_jobs)):
            shape = shapes[(job_id - start) % len(shapes)]
            rows.append({"job_id": job_id, "job_group_id": 0, "cores_mcpu": shape.cores_mcpu,
                         "inst_coll": shape.inst_coll, "priority": shape.priority})
        async with limit:
            await store.insert_jobs(batch_id, update_id, rows)

    await asyncio.gather(*(insert(first) for first in range(0, n_jobs, bunch)))
    inserted = time.perf_counter()
    await store.commit_update(batch_id, update_id)
    if not quiet:
        progress(f"  batch {batch_id}: {n_jobs:,} Ready jobs in {time.perf_counter() - started:.1f} s "
                 f"(insert {inserted - started:.1f} s, commit {time.perf_counter() - inserted:.1f} s)")
    return ReadyBatch(batch_id, user, start, n_jobs)
