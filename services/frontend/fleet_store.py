"""Reads of the deployment's machines for FleetService: the instance collections and their instances.

The collections are the rows `services.db.plan_snapshot.read_deployment` reads for the submission checks
(`services.policy.runnable.never_runs`); the instances are the driver's rows, read as they stand: free
cores as the scheduling procedures keep them, running attempts as the attempts that have not ended
(index attempts_instance). Deleted instances are history: counted nowhere, listed only when asked for.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from services.db.database import Database
from services.db.plan_snapshot import read_deployment
from services.policy.runnable import Deployment

LIVE_OR_ENDING = ("pending", "active", "inactive")
"""The instance states a pool counts (not 'deleted')."""

_INSTANCE_SELECT = """
SELECT i.name, i.inst_coll, i.state, i.region, i.machine_type, i.preemptible, i.cores_mcpu, i.free_cores_mcpu,
       i.memory_bytes, i.time_created_ms, i.time_activated_ms, i.last_heartbeat_ms, i.time_deactivated_ms,
       i.deactivation_reason,
       (SELECT COUNT(*) FROM attempts a WHERE a.instance_name = i.name AND a.end_time_ms IS NULL)
         AS n_running_attempts
FROM instances i
"""


class FleetStore:
    """SQL reads behind ListPools and ListInstances, and the pause of a pool (PausePool, ResumePool)."""

    def __init__(self, db: Database, clock_ms: Callable[[], int] = lambda: int(time.time() * 1000)):
        self.db = db
        self._clock_ms = clock_ms

    async def set_paused(self, pool: str, paused: bool, user: str) -> str:
        """Pause or resume a pool (set_pool_paused): 'paused', 'already paused', 'resumed' or 'not paused';
        NotFoundError for no such pool."""
        status, _ = await self.db.call("set_pool_paused", pool, paused, user, self._clock_ms())
        return str(status["message"])

    async def deployment(self) -> Deployment:
        """The instance collections, by name."""
        return await read_deployment(self.db)

    async def instance_counts(self) -> dict[tuple[str, str], int]:
        """(collection, state) → its instances in that state, for the states in LIVE_OR_ENDING."""
        rows = await self.db.fetchall(
            "SELECT inst_coll, state, COUNT(*) AS n FROM instances WHERE state IN (%s, %s, %s)"
            " GROUP BY inst_coll, state", LIVE_OR_ENDING, name="fleet_instance_counts")
        return {(r["inst_coll"], r["state"]): int(r["n"]) for r in rows}

    async def instances(self, pool: str, state: str | None, after_name: str, limit: int) -> list[dict[str, Any]]:
        """Instances by name after `after_name`, of `pool` (empty: every pool), in `state` (None: every
        state but 'deleted'), each with its attempts that have not ended."""
        where, params = ["i.name > %s"], [after_name]
        if pool:
            where.append("i.inst_coll = %s")
            params.append(pool)
        if state is None:
            where.append("i.state <> 'deleted'")
        else:
            where.append("i.state = %s")
            params.append(state)
        return await self.db.fetchall(
            f"{_INSTANCE_SELECT} WHERE {' AND '.join(where)} ORDER BY i.name LIMIT %s", (*params, limit),
            name="fleet_instances")
