"""Typed calls of corral's stored procedures.

One method per procedure; arguments are plain Python values and the JSON
payloads documented at the top of each `sql/procedures/*.sql`. Every method
raises a `ProcedureError` subclass when the procedure refuses. The clock is
injected (`now_ms`) so tests and loops control time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from services.db.database import Database

Row = dict[str, Any]

INLINE_CHILDREN = 1000
"""Children a completion (MJC, the cancellers' drains) releases in its own
transaction, shared between the jobs it completes; the driver's releaser
takes the rest in chunks (see release_children)."""


def wall_clock_ms() -> int:
    """Milliseconds since the epoch, the default clock."""
    return int(time.time() * 1000)


class JobStore:
    """The state machine of batches, jobs and instances, as procedure calls."""

    def __init__(self, db: Database, clock_ms: Callable[[], int] = wall_clock_ms):
        self.db = db
        self.clock_ms = clock_ms

    # -- billing projects (plain rows: no concurrency to arbitrate) --------

    async def create_billing_project(self, name: str, members: Sequence[str], limit_usd: float | None = None) -> None:
        """Create an open billing project with its first members."""
        await self.db.execute(
            "INSERT INTO billing_projects (name, limit_usd, time_created_ms) VALUES (%s, %s, %s)",
            (name, limit_usd, self.clock_ms()),
            name="create_billing_project",
        )
        for user in members:
            await self.db.execute(
                "INSERT INTO billing_project_members (billing_project, user) VALUES (%s, %s)",
                (name, user),
                name="add_billing_project_member",
            )

    # -- submission (frontend) --------------------------------------------

    async def create_batch(
        self,
        user: str,
        billing_project: str,
        idempotency_token: str | None = None,
        callback_url: str | None = None,
        cancel_after_n_failures: int | None = None,
        attributes: dict[str, str] | None = None,
        request_digest: str | None = None,
    ) -> Row:
        """Create a batch (and its root group 0); returns batch_id, created. `request_digest` (64 hex
        digits) is what the call asked for: the token reused with another is a ConflictError whose
        status has the batch_id (None: the token alone decides, as before migration 0027)."""
        attrs = [{"key": k, "value": v} for k, v in (attributes or {}).items()]
        status, _ = await self.db.call(
            "create_batch", user, billing_project, idempotency_token, request_digest, callback_url,
            cancel_after_n_failures, attrs, self.clock_ms(),
        )
        return status

    async def check_job_limits(
        self, user: str, billing_project: str, n_jobs: int, idempotency_token: str | None = None,
        max_jobs_per_batch: int | None = None, max_open_jobs_per_user: int | None = None,
        max_open_jobs_per_billing_project: int | None = None,
    ) -> None:
        """Refuse (InvalidArgumentError, ResourceExhaustedError) a new batch of `n_jobs` that
        create_update would refuse; reads only (a retry of an existing batch passes). None: no limit."""
        await self.db.call("check_job_limits", user, billing_project, idempotency_token, n_jobs,
                           max_jobs_per_batch, max_open_jobs_per_user, max_open_jobs_per_billing_project)

    async def create_update(
        self, batch_id: int, n_jobs: int, n_job_groups: int = 0, idempotency_token: str | None = None,
        trace_context: str | None = None, max_jobs_per_batch: int | None = None,
        max_open_jobs_per_user: int | None = None, max_open_jobs_per_billing_project: int | None = None,
        request_digest: str | None = None,
    ) -> Row:
        """Reserve ids for an update; returns update_id, start_job_id, start_job_group_id.
        `trace_context` is the creating call's W3C trace context (JSON), handed to workers.
        Refused past the batch's size (InvalidArgumentError) or the open jobs of its owner or
        billing project (ResourceExhaustedError); None: no limit. The token reused with another
        `request_digest` is a ConflictError whose status has the update_id (as create_batch)."""
        status, _ = await self.db.call(
            "create_update", batch_id, idempotency_token, request_digest, n_jobs, n_job_groups, self.clock_ms(),
            trace_context, max_jobs_per_batch, max_open_jobs_per_user, max_open_jobs_per_billing_project,
        )
        return status

    async def insert_job_groups(self, batch_id: int, update_id: int, groups: list[Row]) -> Row:
        """Add job groups to an uncommitted update."""
        status, _ = await self.db.call("insert_job_groups", batch_id, update_id, groups, self.clock_ms())
        return status

    async def insert_jobs(self, batch_id: int, update_id: int, jobs: list[Row],
                          max_children_per_job: int | None = None) -> Row:
        """Add one bunch of jobs to an uncommitted update; refused (InvalidArgumentError) if a
        job would get more than `max_children_per_job` children (None: no limit)."""
        status, _ = await self.db.call("insert_jobs", batch_id, update_id, jobs, self.clock_ms(),
                                       max_children_per_job)
        return status

    async def commit_update(self, batch_id: int, update_id: int) -> Row:
        """Make an update's jobs visible and runnable."""
        status, _ = await self.db.call("commit_update", batch_id, update_id, self.clock_ms())
        return status

    async def cancel_job_group(self, batch_id: int, job_group_id: int, user: str, reason: str) -> Row:
        """Cancel a job group (0 = the whole batch) in O(1)."""
        status, _ = await self.db.call("cancel_job_group", batch_id, job_group_id, user, reason, self.clock_ms())
        return status

    async def hold_jobs(self, batch_id: int, user: str, job_group_id: int = 0, job_id: int | None = None,
                        max_held_jobs: int | None = None) -> Row:
        """Hold a job group (0 = the whole batch) or one job (`job_id`) in O(1): Ready, but not scheduled until
        released. `message`: held, already held, or complete (a final job: nothing held)."""
        status, _ = await self.db.call("hold_jobs", batch_id, job_group_id, job_id, user, self.clock_ms(),
                                       max_held_jobs)
        return status

    async def release_jobs(self, batch_id: int, job_group_id: int = 0, job_id: int | None = None) -> Row:
        """Release the hold of a job group (0 = the whole batch) or of one job. `message`: released or not held."""
        status, _ = await self.db.call("release_jobs", batch_id, job_group_id, job_id)
        return status

    async def delete_batch(self, batch_id: int) -> Row:
        """Hide a batch from every read (cancel it first with cancel_job_group)."""
        status, _ = await self.db.call("delete_batch", batch_id)
        return status

    async def discard_batch(self, batch_id: int, user: str) -> Row:
        """Take back a batch no update of which was committed, after the call that created it was refused:
        cancelled, deleted and its idempotency token released (FailedPreconditionError once committed)."""
        status, _ = await self.db.call("discard_batch", batch_id, user, self.clock_ms())
        return status

    async def rerun_failed_jobs(
        self, batch_id: int, idempotency_token: str, states_bits: int, max_jobs_per_batch: int | None = None,
        max_open_jobs_per_user: int | None = None, max_open_jobs_per_billing_project: int | None = None,
        max_children_per_job: int | None = None, request_digest: str | None = None,
    ) -> Row:
        """An uncommitted update of copies of the jobs in `states_bits` (2 Failed, 4 Error,
        8 Cancelled) and their dependents; returns update_id (None: nothing to re-run),
        start_job_id, n_jobs. Commit it with commit_update. The limits as for create_update
        and insert_jobs; the token reused with another `request_digest` as create_update."""
        status, _ = await self.db.call("rerun_failed_jobs", batch_id, idempotency_token, request_digest,
                                       states_bits, self.clock_ms(), max_jobs_per_batch, max_open_jobs_per_user,
                                       max_open_jobs_per_billing_project, max_children_per_job)
        return status

    # -- driver ------------------------------------------------------------

    async def elect_leader(self, name: str) -> int:
        """Start a new leader epoch by force, deposing whoever leads, with no lease (any campaigning driver
        takes over from it); returns it. For tools and tests under the administrator's account: drivers
        campaign with `acquire_leader_lease`."""
        status, _ = await self.db.call("elect_leader", name, self.clock_ms())
        return int(status["epoch"])

    async def acquire_leader_lease(self, name: str, lease_ms: int) -> Row:
        """Take the leader lease if it has expired by the database's clock (a new epoch), else nothing;
        returns elected (1 or 0), epoch (the current one), leader_name and lease_ms_left."""
        status, _ = await self.db.call("acquire_leader_lease", name, lease_ms, self.clock_ms())
        return status

    async def renew_leader_lease(self, epoch: int, lease_ms: int) -> None:
        """Extend the lease of `epoch` to `lease_ms` from now; StaleEpochError if another driver took
        over, FailedPreconditionError if it already expired."""
        await self.db.call("renew_leader_lease", epoch, lease_ms)

    async def release_leader_lease(self, epoch: int) -> None:
        """Let the lease of `epoch` expire now (clean shutdown); StaleEpochError if another driver leads."""
        await self.db.call("release_leader_lease", epoch)

    async def create_instance(
        self, epoch: int, name: str, inst_coll: str, cores_mcpu: int, activation_token: str,
        region: str = "local", machine_type: str | None = None, memory_bytes: int = 0,
        preemptible: bool | None = None, storage_bytes: int = 0, products: tuple[str, str] | None = None,
    ) -> None:
        """Record a machine about to be created (state pending); `preemptible`: a spot machine (None: the
        pool's kind); memory or storage 0: not known (not checked there); `products`: the cpu and memory
        products its attempts are billed to (None: the local provider's)."""
        cpu_product, memory_product = products or (None, None)
        await self.db.call(
            "create_instance", epoch, name, inst_coll, region, machine_type, cores_mcpu, memory_bytes,
            activation_token, self.clock_ms(), preemptible, storage_bytes, cpu_product, memory_product,
        )

    async def add_regions(self, names: Sequence[str]) -> int:
        """Make sure `regions` has these (a cloud deployment's configured regions); how many were added."""
        status, _ = await self.db.call("add_regions", list(names))
        return int(status["n_added"])

    async def place_instance(self, epoch: int, name: str, region: str, machine_type: str | None,
                             products: tuple[str, str]) -> None:
        """Where the cloud put a created machine: its region, machine type and billed products."""
        await self.db.call("place_instance", epoch, name, region, machine_type, *products)

    async def set_product_rates(self, rates: Sequence[Mapping[str, Any]], source: str,
                                active_products: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """Set products' rates, each {"product", "unit", "rate_usd"} (a changed rate is a new resource
        version: set_product_rates.sql); `active_products`: every product the deployment's machines are
        billed to (the others become inactive). The products whose price changed: product, resource_name,
        rate_usd, previous_rate_usd."""
        _, (changed,) = await self.db.call("set_product_rates", list(rates), source, self.clock_ms(),
                                           None if active_products is None else list(active_products))
        return list(changed)

    async def activate_instance(self, epoch: int, name: str, activation_token: str,
                                ip_address: str | None = "127.0.0.1", storage_bytes: int = 0) -> None:
        """pending -> active, when the worker presents its activation token; `ip_address` is the
        host:port of its WorkerService, `storage_bytes` the scratch storage it reports (0: it did not say,
        the instance keeps what it was created with)."""
        await self.db.call("activate_instance", epoch, name, activation_token, ip_address, self.clock_ms(),
                           storage_bytes)

    async def enroll_instance(self, name: str, activation_token: str, token_ttl_ms: int) -> None:
        """Consume the pending instance's one-time activation token for its certificate (issue 16), within
        `token_ttl_ms` of the instance's creation; PermissionDeniedError, saying nothing more, if the token
        is wrong, used, expired, another instance's or its instance's no longer pending."""
        await self.db.call("enroll_instance", name, activation_token, self.clock_ms(), token_ttl_ms)

    async def instance_state(self, name: str) -> str | None:
        """The instance's state ('pending', 'active', 'inactive', 'deleted'), or None if there is none."""
        row = await self.db.fetchone("SELECT state FROM instances WHERE name = %s", (name,), name="instance_state")
        return None if row is None else str(row["state"])

    async def deactivate_instance(self, epoch: int, name: str, reason: str, end_reason: str = "worker_lost") -> Row:
        """The machine is gone: its running jobs' attempts end with `end_reason` (worker_lost or preempted), and
        each job runs again while it has attempts left (n_rescheduled), else ends in Error (n_ended)."""
        status, _ = await self.db.call("deactivate_instance", epoch, name, reason, end_reason, self.clock_ms())
        return status

    async def cancel_unaffordable_jobs(self, epoch: int, jobs: list[Row], max_children: int = 1000) -> int:
        """Cancel those of `jobs` ([{batch_id, job_id}]) that can never run under their project's limit (checked
        again under its lock), saying why; returns how many were cancelled."""
        status, _ = await self.db.call("cancel_unaffordable_jobs", epoch, jobs, self.clock_ms(), max_children)
        return int(status["n_cancelled"])

    async def schedule_jobs(self, epoch: int, instance_name: str | None, jobs: list[Row]) -> list[Row]:
        """SJ: [{batch_id, job_id, attempt_id, instance_name}] -> per-job outcomes; a job that names no instance
        goes on `instance_name`."""
        _, result_sets = await self.db.call("schedule_jobs", epoch, instance_name, jobs, self.clock_ms())
        return result_sets[0]

    async def mark_jobs_started(self, epoch: int, instance_name: str, jobs: list[Row],
                                instance_products: bool = False) -> Row:
        """MJS: [{batch_id, job_id, attempt_id, start_time_ms, isolation, image_digest?, cpu_resource?,
        memory_resource?, instance_name?}] -> the status row (n_started) with `outcomes`, one {batch_id, job_id, attempt_id, outcome}
        per job. A row's instance_name, where given, is its attempt's instance instead of `instance_name`.
        `instance_products`: a started attempt is billed to the instance's products at their current
        prices, where its row names no resource (what the driver does)."""
        status, result_sets = await self.db.call("mark_jobs_started", epoch, instance_name, jobs, instance_products)
        return {**status, "outcomes": result_sets[0]}

    async def add_attempt_resources(self, epoch: int, resources: list[Row]) -> None:
        """[{batch_id, job_id, attempt_id, resource, quantity}]."""
        await self.db.call("add_attempt_resources", epoch, resources)

    async def mark_jobs_complete(self, epoch: int, instance_name: str | None, jobs: list[Row],
                                 max_children: int = INLINE_CHILDREN) -> list[Row]:
        """MJC: [{batch_id, job_id, attempt_id, state, exit_code, start_time_ms, end_time_ms, reason,
        error_message, cpu_time_ms, peak_memory_bytes}] -> per-job outcomes. Releases up to
        `max_children` children of the completed jobs; the releaser takes the rest."""
        return (await self.mark_jobs_complete_status(epoch, instance_name, jobs, max_children))["outcomes"]

    async def mark_jobs_complete_status(self, epoch: int, instance_name: str | None, jobs: list[Row],
                                        max_children: int = INLINE_CHILDREN) -> Row:
        """MJC, with its status row (n_completed, n_retried, n_queued, n_ready_children) and `outcomes`:
        {batch_id, job_id, outcome, inst_coll, cores_mcpu, user} per job, `user` set where the job's
        attempt left Running or Creating now. A row's instance_name, where given, is its attempt's instance
        instead of `instance_name`; a job appears at most once per call."""
        status, result_sets = await self.db.call("mark_jobs_complete", epoch, instance_name, jobs,
                                                 self.clock_ms(), max_children)
        return {**status, "outcomes": result_sets[0]}

    async def heartbeat_rollup(self, epoch: int, instance_name: str, attempts: list[Row]) -> Row:
        """[{batch_id, job_id, attempt_id, rollup_time_ms}] from a heartbeat."""
        status, _ = await self.db.call("heartbeat_rollup", epoch, instance_name, attempts, self.clock_ms())
        return status

    async def cancel_ready_jobs(self, epoch: int, batch_id: int, limit: int,
                                max_children: int = INLINE_CHILDREN) -> int:
        """The canceller's drain of one batch; returns how many were cancelled."""
        status, _ = await self.db.call("cancel_ready_jobs", epoch, batch_id, limit, self.clock_ms(), max_children)
        return int(status["n_cancelled"])

    async def cancel_pending_jobs(self, epoch: int, batch_id: int, limit: int,
                                  max_children: int = INLINE_CHILDREN) -> int:
        """The canceller's bulk drain of Pending jobs of cancelled groups of one batch;
        returns how many were cancelled."""
        status, _ = await self.db.call("cancel_pending_jobs", epoch, batch_id, limit, self.clock_ms(),
                                       max_children)
        return int(status["n_cancelled"])

    async def release_children(self, epoch: int, max_children: int, max_parents: int,
                               now_ms: int | None = None) -> Row:
        """The releaser: up to `max_children` queued children of up to `max_parents` completed
        parents in one transaction; returns n_children, n_parents, n_finished."""
        status, _ = await self.db.call("release_children", epoch, max_children, max_parents, self._now(now_ms))
        return status

    async def publish_batch_events(self, epoch: int, max_events: int, cost_interval_ms: int | None = None) -> Row:
        """Move up to `max_events` committed outbox rows into batch_events (and, with
        `cost_interval_ms`, add cost events); returns n_published, n_cost_events."""
        status, _ = await self.db.call("publish_batch_events", epoch, max_events, cost_interval_ms, self.clock_ms())
        return status

    # -- driver loops (services/driver/: failure_canceller, completions, callbacks, billing_limit_canceller)

    def _now(self, now_ms: int | None) -> int:
        return self.clock_ms() if now_ms is None else now_ms

    async def cancel_failed_job_groups(self, epoch: int, limit: int, now_ms: int | None = None) -> int:
        """Cancel running groups whose failures reached cancel_after_n_failures; returns how many."""
        status, _ = await self.db.call("cancel_failed_job_groups", epoch, limit, self._now(now_ms))
        return int(status["n_cancelled"])

    async def recheck_completions(self, epoch: int, limit: int, now_ms: int | None = None) -> Row:
        """Re-run the completion check of finished groups left running; n_checked, n_complete, ..."""
        status, _ = await self.db.call("recheck_completions", epoch, limit, self._now(now_ms))
        return status

    async def claim_batch_callbacks(self, epoch: int, limit: int, lease_ms: int, now_ms: int | None = None
                                    ) -> list[Row]:
        """Lease due completion callbacks for sending: [{batch_id, n_jobs, callback_attempts, ...}]."""
        _, result_sets = await self.db.call("claim_batch_callbacks", epoch, limit, lease_ms, self._now(now_ms))
        return result_sets[0]

    async def record_batch_callback(self, epoch: int, batch_id: int, n_jobs: int, outcome: str,
                                    error: str | None = None, next_attempt_ms: int | None = None,
                                    now_ms: int | None = None) -> Row:
        """What one callback POST came to: outcome 'sent', 'retry' or 'given_up'."""
        status, _ = await self.db.call("record_batch_callback", epoch, batch_id, n_jobs, outcome, error,
                                       next_attempt_ms, self._now(now_ms))
        return status

    async def cancel_batches_over_limit(self, epoch: int, limit: int, now_ms: int | None = None) -> int:
        """Cancel running batches of billing projects whose cost reached the limit; returns how many."""
        status, _ = await self.db.call("cancel_batches_over_limit", epoch, limit, self._now(now_ms))
        return int(status["n_cancelled"])
