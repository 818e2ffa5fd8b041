"""The reads about machines: the autoscaler's pools and demand by region, the instances the dead-worker
detector and the reconciler watch, and a worker's session credentials."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from services.db.database import Database

_POOLS = """
SELECT c.name, c.worker_cores, c.worker_memory_bytes, c.worker_storage_bytes, c.max_instances,
       c.max_new_instances_per_loop, c.preemptible,
       (SELECT COALESCE(SUM(i.free_cores_mcpu), 0) FROM instances i
          WHERE i.inst_coll = c.name AND i.state IN ('pending', 'active')) AS free_cores_mcpu,
       (SELECT COUNT(*) FROM instances i WHERE i.inst_coll = c.name AND i.state IN ('pending', 'active'))
         AS n_live,
       -- Jobs that must run on on-demand machines (few: on_demand_jobs lists them), and the room for them.
       IF(c.preemptible, (SELECT COALESCE(SUM(j.cores_mcpu), 0) FROM on_demand_jobs o
                          JOIN jobs j ON j.batch_id = o.batch_id AND j.job_id = o.job_id AND j.state = 'Ready'
                          WHERE o.inst_coll = c.name), 0) AS on_demand_ready_mcpu,
       (SELECT COALESCE(SUM(i.free_cores_mcpu), 0) FROM instances i
          WHERE i.inst_coll = c.name AND i.state IN ('pending', 'active') AND NOT i.preemptible)
         AS on_demand_free_mcpu
FROM instance_collections c
WHERE c.is_pool AND c.enabled AND NOT c.paused  -- a paused pool gets no new machine (migration 0030)
"""

_SEEN = """
SELECT name, state, COALESCE(last_heartbeat_ms, time_activated_ms, time_created_ms) AS seen_ms
FROM instances WHERE state IN ('pending', 'active')
"""

_LIVE = "SELECT name, preemptible, time_created_ms FROM instances WHERE state IN ('pending', 'active')"
_LIVE_AMONG = "SELECT name FROM instances WHERE state IN ('pending', 'active') AND name IN ({marks})"
_NAMES_PER_STATEMENT = 1000
"""Names per statement when looking many machines up."""


@dataclasses.dataclass(frozen=True)
class PoolState:
    """An enabled pool: its machines' shape and limits, and what its live instances offer now."""

    name: str
    worker_cores: int
    """Cores of each of its machines."""
    worker_memory_bytes: int
    """Memory of each (0: not known)."""
    worker_storage_bytes: int
    """Scratch storage of each (0: not known)."""
    max_instances: int
    max_new_instances_per_loop: int
    preemptible: bool
    """A spot pool."""
    free_cores_mcpu: int
    """Free cores of its pending and active instances."""
    n_live: int
    """Its pending and active instances."""
    on_demand_ready_mcpu: int
    """Cores of its Ready jobs that must run on an on-demand machine (a spot pool's; 0 otherwise)."""
    on_demand_free_mcpu: int
    """Free cores of its live on-demand instances."""


@dataclasses.dataclass(frozen=True)
class SeenInstance:
    """A pending or active instance, and when the driver last heard of it."""

    name: str
    state: str
    """'pending' or 'active'."""
    seen_ms: int
    """Its last heartbeat, else its activation, else its creation."""


@dataclasses.dataclass(frozen=True)
class LiveInstance:
    """A pending or active instance, as the reconciler compares it with the cloud's machines."""

    name: str
    preemptible: bool
    created_ms: int


@dataclasses.dataclass(frozen=True)
class WorkerCredentials:
    """What a worker's session token is checked against."""

    activation_token: str
    state: str


class InstanceReads:
    """The reads about machines (module docstring)."""

    db: Database

    async def pools(self) -> list[PoolState]:
        """Every enabled pool, with what its live instances offer."""
        return [PoolState(r["name"], int(r["worker_cores"]), int(r["worker_memory_bytes"] or 0),
                          int(r["worker_storage_bytes"] or 0), int(r["max_instances"]),
                          int(r["max_new_instances_per_loop"]), bool(r["preemptible"]), int(r["free_cores_mcpu"]),
                          int(r["n_live"]), int(r["on_demand_ready_mcpu"]), int(r["on_demand_free_mcpu"]))
                for r in await self.db.fetchall(_POOLS, name="autoscaler_pools")]

    async def regions(self) -> dict[int, str]:
        """The regions jobs may name, by region_id (a job's regions are bits of it)."""
        rows = await self.db.fetchall("SELECT region_id, name FROM regions ORDER BY region_id",
                                      name="autoscaler_regions")
        return {int(r["region_id"]): r["name"] for r in rows}

    async def priced(self, cpu_product: str, memory_product: str) -> bool:
        """Whether both products have a price."""
        row = await self.db.fetchone("SELECT COUNT(*) AS n FROM latest_product_versions WHERE product IN (%s, %s)",
                                     (cpu_product, memory_product), name="autoscaler_priced")
        return row is not None and int(row["n"]) == 2

    async def seen_instances(self) -> list[SeenInstance]:
        """Every pending and active instance, with when it was last heard of (the dead-worker detector)."""
        return [SeenInstance(r["name"], r["state"], int(r["seen_ms"]))
                for r in await self.db.fetchall(_SEEN, name="dead_worker_candidates")]

    async def live_instances(self) -> list[LiveInstance]:
        """Every pending and active instance (the reconciler)."""
        return [LiveInstance(r["name"], bool(r["preemptible"]), int(r["time_created_ms"]))
                for r in await self.db.fetchall(_LIVE, name="reconciler_live_instances")]

    async def live_among(self, names: Sequence[str]) -> set[str]:
        """Those of `names` that are pending or active instances, looked up a thousand at a time."""
        live: set[str] = set()
        for i in range(0, len(names), _NAMES_PER_STATEMENT):
            chunk = names[i:i + _NAMES_PER_STATEMENT]
            rows = await self.db.fetchall(_LIVE_AMONG.format(marks=", ".join(["%s"] * len(chunk))), tuple(chunk),
                                          name="reconciler_known_instances")
            live |= {r["name"] for r in rows}
        return live

    async def worker_credentials(self, instance: str) -> WorkerCredentials | None:
        """The instance's activation token and state; None if there is no such instance."""
        row = await self.db.fetchone("SELECT activation_token, state FROM instances WHERE name = %s", (instance,),
                                     name="instance_token")
        return None if row is None else WorkerCredentials(row["activation_token"], row["state"])
