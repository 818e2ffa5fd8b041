"""Retries that know why an attempt ended (decide_retries, migration 0014),
every transition: an attempt's end either gives the job a new attempt
(Ready again, with what the next one needs) or ends it as reported.

Allowed: out of memory with a memory factor (up to the pool's machine),
exit codes the policy lists (with growing, jittered delays, up to
max_failed_retries), a lost worker, a preemption (on-demand after N), a
system error (away from that worker). Refused: no policy, an exit code or
reason the policy does not cover, a memory that cannot grow, no attempts
left, a repeated report of an attempt already retried. The planner then
honours the next attempt's back-off, on-demand and avoided worker.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import duration_pb2

from corral.batch.v1 import job_spec_pb2 as spec_pb
from services.db.invariants import check_invariants
from services.db.plan_snapshot import read_demand, read_snapshot, read_workers
from services.frontend.validate import retry_policy_json
from services.policy import planner
from tests.world import World

GIB = 2**30
STANDARD_MACHINE = 8 * GIB  # the local standard pool's worker memory (migration 0002)


def policy(**fields: Any) -> str:
    return retry_policy_json(spec_pb.RetryPolicy(**fields))


async def one_job(world: World, **job: Any) -> tuple[int, int]:
    batch_id, _, start = await world.batch([job])
    return batch_id, start


async def report(world: World, batch_id: int, job_id: int, attempt: str, state: str, reason: str,
                 exit_code: int | None = None, instance: str = "i1") -> str:
    result = await world.store.mark_jobs_complete(world.epoch, instance, [
        {"batch_id": batch_id, "job_id": job_id, "attempt_id": attempt, "state": state, "exit_code": exit_code,
         "reason": reason, "start_time_ms": world.clock(), "end_time_ms": world.clock.advance(1000)}])
    return result[0]["outcome"]


async def attempt(world: World, batch_id: int, job_id: int, attempt_id: str) -> dict[str, Any]:
    row = await world.db.fetchone("SELECT * FROM attempts WHERE batch_id = %s AND job_id = %s AND attempt_id = %s",
                                  (batch_id, job_id, attempt_id))
    assert row is not None
    return row


async def test_out_of_memory_grows_the_memory_up_to_the_pools_machine(world: World) -> None:
    await world.instance()
    batch_id, job_id = await one_job(world, memory_bytes=3 * GIB, max_attempts=5,
                                     retry_policy=policy(retry_oom_with_memory_factor=2.0))
    memories = []
    for _ in range(3):
        a = await world.run(batch_id, job_id)
        memories.append((await world.job(batch_id, job_id))["memory_bytes"])
        outcome = await report(world, batch_id, job_id, a, "Failed", "out_of_memory", 137)
    # 3 GiB, then 6, then the machine's 8; out of memory at 8 GiB cannot grow: the job fails.
    assert memories == [3 * GIB, 6 * GIB, STANDARD_MACHINE]
    assert outcome == "completed"
    job = await world.job(batch_id, job_id)
    assert (job["state"], job["n_attempts"], job["n_failed_retries"]) == ("Failed", 3, 0)
    first = await attempt(world, batch_id, job_id, "a1")
    assert (first["reason"], first["retry_reason"]) == ("out_of_memory", "out of memory at 3072 MiB: retried with 6144 MiB")
    assert (await attempt(world, batch_id, job_id, "a3"))["retry_reason"] is None
    assert await check_invariants(world.db) == []


async def test_max_memory_bytes_caps_the_growth(world: World) -> None:
    await world.instance()
    batch_id, job_id = await one_job(world, memory_bytes=GIB, retry_policy=policy(
        retry_oom_with_memory_factor=4.0, max_memory_bytes=2 * GIB))
    a = await world.run(batch_id, job_id)
    assert await report(world, batch_id, job_id, a, "Failed", "out_of_memory", 137) == "retried"
    assert (await world.job(batch_id, job_id))["memory_bytes"] == 2 * GIB


async def test_without_a_policy_nothing_the_command_did_is_retried(world: World) -> None:
    await world.instance()
    batch_id, _, start = await world.batch([{"memory_bytes": GIB}, {}, {"retry_policy": policy(
        retry_oom_with_memory_factor=2.0, max_failed_retries=5)}])
    a = await world.run(batch_id, start)
    assert await report(world, batch_id, start, a, "Failed", "out_of_memory", 137) == "completed"
    b = await world.run(batch_id, start + 1)
    assert await report(world, batch_id, start + 1, b, "Failed", "exited", 3) == "completed"
    # A timeout is the job's own limit: never retried, whatever the policy.
    c = await world.run(batch_id, start + 2)
    assert await report(world, batch_id, start + 2, c, "Failed", "timed_out") == "completed"
    assert [await world.state(batch_id, start + i) for i in range(3)] == ["Failed"] * 3


async def test_listed_exit_codes_retry_with_growing_jittered_delays(world: World) -> None:
    await world.instance()
    batch_id, _, start = await world.batch([
        {"max_attempts": 10, "retry_policy": policy(max_failed_retries=3, retry_exit_codes=[3, 75],
                                                    retry_delay=duration_pb2.Duration(seconds=1))},
        {"max_attempts": 10, "retry_policy": policy(max_failed_retries=3, retry_exit_codes=[3])}])
    job_id = start
    delays = []
    for _ in range(4):
        job = await world.job(batch_id, job_id)
        if job["not_before_ms"] is not None:
            world.clock.advance(max(0, job["not_before_ms"] - world.clock()))
        a = await world.run(batch_id, job_id)
        outcome = await report(world, batch_id, job_id, a, "Failed", "exited", 3)
        row = await attempt(world, batch_id, job_id, a)
        delays.append(row["retry_delay_ms"])
        if outcome == "retried":
            job = await world.job(batch_id, job_id)
            assert job["not_before_ms"] == world.clock() + row["retry_delay_ms"]
            assert row["retry_reason"].startswith(f"exit code 3: retry {len(delays)} of 3 after ")
    # Retry k waits 1 s x 2^k less up to half: (500, 1000], (1000, 2000], (2000, 4000]; then no more.
    assert delays[3] is None and await world.state(batch_id, job_id) == "Failed"
    for k, delay in enumerate(delays[:3]):
        assert 1000 * 2**k / 2 <= delay <= 1000 * 2**k, delays
    assert delays[0] <= delays[1] <= delays[2]
    assert (await world.job(batch_id, job_id))["n_failed_retries"] == 3
    # An exit code the policy does not list fails at once.
    b = await world.run(batch_id, start + 1)
    assert await report(world, batch_id, start + 1, b, "Failed", "exited", 4) == "completed"


async def test_a_job_takes_its_nearest_groups_policy(world: World) -> None:
    await world.instance()
    groups = [{"job_group_id": 1, "parent_id": 0, "retry_policy": policy(max_failed_retries=1)},
              {"job_group_id": 2, "parent_id": 1}]
    batch_id, _, start = await world.batch([{"job_group_id": 2}, {"job_group_id": 0}], groups=groups)
    a = await world.run(batch_id, start)
    assert await report(world, batch_id, start, a, "Failed", "exited", 1) == "retried"
    b = await world.run(batch_id, start + 1)  # the root group sets none
    assert await report(world, batch_id, start + 1, b, "Failed", "exited", 1) == "completed"


async def test_a_lost_worker_is_not_a_failure_until_the_attempts_run_out(world: World) -> None:
    await world.instance("i1")
    await world.instance("i2")
    batch_id, job_id = await one_job(world, max_attempts=2)
    world.clock.advance(1000)
    await world.run(batch_id, job_id, "i1")
    status = await world.store.deactivate_instance(world.epoch, "i1", "missed heartbeats")
    assert (status["n_rescheduled"], status["n_ended"]) == (1, 0)
    job = await world.job(batch_id, job_id)
    assert (job["state"], job["n_failed_retries"], job["avoid_instance"]) == ("Ready", 0, None)
    first = await attempt(world, batch_id, job_id, "a1")
    assert (first["reason"], first["retry_reason"]) == ("worker_lost", "its worker was lost: not a failure")
    # On its last attempt a lost worker ends the job, saying why.
    await world.run(batch_id, job_id, "i2")
    status = await world.store.deactivate_instance(world.epoch, "i2", "missed heartbeats")
    assert (status["n_rescheduled"], status["n_ended"]) == (0, 1)
    assert await world.state(batch_id, job_id) == "Error"
    last = await attempt(world, batch_id, job_id, "a2")
    assert last["error_message"] == "its worker was lost (i2: missed heartbeats)" and last["retry_reason"] is None
    assert (await world.batch_row(batch_id))["state"] == "complete"
    assert await check_invariants(world.db) == []


async def test_preemptions_move_the_job_to_on_demand_machines(world: World) -> None:
    batch_id, job_id = await one_job(world, max_attempts=5,
                                     retry_policy=policy(max_preemptions_before_on_demand=2))
    for n, name in enumerate(("spot-1", "spot-2"), start=1):
        await world.instance(name)
        await world.run(batch_id, job_id, name)
        await world.store.deactivate_instance(world.epoch, name, "reclaimed", "preempted")
        job = await world.job(batch_id, job_id)
        assert (job["state"], job["n_preemptions"], job["on_demand"]) == ("Ready", n, n == 2)
    second = await attempt(world, batch_id, job_id, "a2")
    assert (second["reason"], second["retry_reason"]) == (
        "preempted", "preempted (2 so far): not a failure; on-demand machines from now on")
    assert await world.db.fetchall("SELECT batch_id, job_id FROM on_demand_jobs") == [
        {"batch_id": batch_id, "job_id": job_id}]
    assert await check_invariants(world.db) == []


async def test_a_system_error_retries_away_from_that_worker(world: World) -> None:
    await world.instance("i1")
    batch_id, job_id = await one_job(world)
    a = await world.run(batch_id, job_id, "i1")
    assert await report(world, batch_id, job_id, a, "Error", "system_error") == "retried"
    job = await world.job(batch_id, job_id)
    assert (job["state"], job["avoid_instance"]) == ("Ready", "i1")


async def test_a_repeated_report_of_a_retried_attempt_changes_nothing(world: World) -> None:
    await world.instance()
    batch_id, job_id = await one_job(world, memory_bytes=GIB, retry_policy=policy(retry_oom_with_memory_factor=2.0))
    a = await world.run(batch_id, job_id)
    assert await report(world, batch_id, job_id, a, "Failed", "out_of_memory", 137) == "retried"
    # The worker did not hear the acknowledgement and sends it again: the job stays Ready, then runs its retry.
    assert await report(world, batch_id, job_id, a, "Failed", "out_of_memory", 137) == "already_complete"
    assert await world.state(batch_id, job_id) == "Ready"
    b = await world.run(batch_id, job_id)
    assert await report(world, batch_id, job_id, a, "Failed", "out_of_memory", 137) == "already_complete"
    assert (await world.job(batch_id, job_id))["attempt_id"] == b
    assert await world.finish(batch_id, job_id, b, "Success") == "completed"
    assert await check_invariants(world.db) == []


async def test_the_planner_honours_back_off_on_demand_and_the_avoided_worker(world: World) -> None:
    for name in ("i1", "i2"):
        await world.instance(name, cores_mcpu=4000)
    await world.db.execute("UPDATE instances SET preemptible = TRUE WHERE name = 'i2'")
    batch_id, _, start = await world.batch([
        {"max_attempts": 5, "retry_policy": policy(max_failed_retries=2, retry_delay=duration_pb2.Duration(seconds=60))},
        {}])
    a = await world.run(batch_id, start, "i1")
    assert await report(world, batch_id, start, a, "Failed", "exited", 1) == "retried"
    c = await world.run(batch_id, start + 1, "i1")
    assert await report(world, batch_id, start + 1, c, "Error", "system_error") == "retried"
    await world.db.execute("UPDATE jobs SET on_demand = TRUE WHERE batch_id = %s AND job_id = %s",
                           (batch_id, start + 1))

    async def plan() -> planner.Plan:
        workers = (await read_workers(world.db, "standard"))["standard"]
        demands = (await read_demand(world.db))["standard"]
        snapshot = await read_snapshot(world.db, "standard", workers, demands, 300, world.clock() / 1000)
        return planner.plan(snapshot)

    first = await plan()
    placed = {p.key: p.worker for p in first.placements}
    assert (batch_id, start) not in placed and first.waits[(batch_id, start)].code == planner.RETRY_DELAY
    # On demand and avoiding i1: nowhere (i2 is a spot machine).
    assert first.waits[(batch_id, start + 1)].code == planner.NO_CAPACITY_IN_REGIONS
    assert "on-demand" in first.waits[(batch_id, start + 1)].detail
    await world.db.execute("UPDATE instances SET preemptible = FALSE WHERE name = 'i2'")
    world.clock.advance(61_000)
    later = {p.key: p.worker for p in (await plan()).placements}
    assert later[(batch_id, start)] in ("i1", "i2") and later[(batch_id, start + 1)] == "i2"
