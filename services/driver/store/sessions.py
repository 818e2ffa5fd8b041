"""The reads behind the commands a worker's session carries: what a Run command needs of each job, the
attempts to send again on a new session, and the sealed secrets the jobs mount."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from services.db.database import Database

JobKey = tuple[int, int]
"""(batch_id, job_id)."""

# As schedule_jobs returns them for the jobs it schedules (Placement.run).
_RUN_DETAILS = """
SELECT j.batch_id, j.job_id, j.spec_ref, j.memory_bytes, j.storage_bytes, j.timeout_ms, b.user,
       b.billing_project, u.trace_context,
       IF(p.limit_usd IS NULL, NULL, p.max_job_duration_ms) AS budget_timeout_ms
FROM jobs j JOIN batches b ON b.batch_id = j.batch_id
JOIN billing_projects p ON p.name = b.billing_project
LEFT JOIN batch_updates u ON u.batch_id = j.batch_id AND u.update_id = j.update_id
WHERE (j.batch_id, j.job_id) IN ({keys})
"""

_UNSTARTED = """
SELECT a.batch_id, a.job_id, a.attempt_id, j.cores_mcpu FROM attempts a
JOIN jobs j ON j.batch_id = a.batch_id AND j.job_id = a.job_id AND j.attempt_id = a.attempt_id
WHERE a.instance_name = %s AND a.end_time_ms IS NULL AND a.start_time_ms IS NULL
  AND j.state IN ('Creating', 'Running')
"""

_SEALED = "SELECT billing_project, name, sealed, key_id FROM secrets WHERE (billing_project, name) IN ({keys})"


@dataclasses.dataclass(frozen=True)
class UnstartedAttempt:
    """An open attempt on an instance that its worker has not reported started."""

    batch_id: int
    job_id: int
    attempt_id: str
    cores_mcpu: int


@dataclasses.dataclass(frozen=True)
class SealedSecret:
    """A secret's row as the frontend sealed it (services.common.sealing)."""

    sealed: bytes = dataclasses.field(repr=False)
    key_id: str
    """The deployment key it was sealed with."""


class SessionReads:
    """The reads behind a worker's commands (module docstring)."""

    db: Database

    async def run_details(self, keys: Sequence[JobKey]) -> dict[JobKey, Mapping[str, Any]]:
        """What a Run command needs of each job, as schedule_jobs returns it: spec_ref, memory_bytes,
        storage_bytes, timeout_ms, user, billing_project, trace_context, budget_timeout_ms."""
        rows = await self.db.fetchall(_RUN_DETAILS.format(keys=", ".join(["(%s, %s)"] * len(keys))),
                                      tuple(v for key in keys for v in key), name="run_job_details")
        return {(r["batch_id"], r["job_id"]): r for r in rows}

    async def unstarted_attempts(self, instance: str) -> list[UnstartedAttempt]:
        """The instance's open attempts of Creating and Running jobs that it never reported started."""
        return [UnstartedAttempt(int(r["batch_id"]), int(r["job_id"]), r["attempt_id"], int(r["cores_mcpu"]))
                for r in await self.db.fetchall(_UNSTARTED, (instance,), name="unstarted_attempts")]

    async def sealed_secrets(self, names: Sequence[tuple[str, str]]) -> dict[tuple[str, str], SealedSecret]:
        """The sealed rows of these (billing project, secret name) pairs that exist, in one query."""
        if not names:
            return {}
        rows = await self.db.fetchall(_SEALED.format(keys=", ".join(["(%s, %s)"] * len(names))),
                                      tuple(v for pair in names for v in pair), name="secrets_to_deliver")
        return {(r["billing_project"], r["name"]): SealedSecret(bytes(r["sealed"]), r["key_id"]) for r in rows}
