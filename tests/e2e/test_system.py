"""The whole system as processes (`corral up` with local workers): a DAG ends
as design §3 predicts and WatchBatch tells each change once; two users share
the cores evenly; a large batch cancels at once while its jobs run; workers
come with work, leave when idle, and a killed worker's job runs again.

One `corral up` serves the module; each test waits for its own batches to
finish, so the next one starts on an idle system."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import corral
from corral.batch.v1 import batch_pb2, job_pb2, job_state_pb2
from tests.e2e import cluster as up
from tests.e2e.cluster import Cluster, eventually

WORKER_CORES = 4
MAX_WORKERS = 2


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = up.start(tmp_path_factory.mktemp("system"), "--worker-cores", str(WORKER_CORES),
                       "--max-workers", str(MAX_WORKERS), "--heartbeat-timeout", "6", "--idle-timeout", "8")
    yield from up.running(cluster)


FINAL = {"succeeded": job_state_pb2.JOB_STATE_SUCCEEDED, "failed": job_state_pb2.JOB_STATE_FAILED,
         "cancelled": job_state_pb2.JOB_STATE_CANCELLED}


# ------------------------------------------------------------------ a 1,000-job DAG


@dataclass
class PlannedJob:
    """A job of the DAG and what design §3 says becomes of it."""

    fails: bool
    parents: list[int] = field(default_factory=list)
    accept: tuple[str, ...] = ("succeeded",)
    always_run: bool = False

    def outcome(self, parent_outcomes: list[str]) -> str:
        """Ready when every parent is final in an accepted state, else Cancelled unless always_run."""
        if self.always_run or all(p in self.accept for p in parent_outcomes):
            return "failed" if self.fails else "succeeded"
        return "cancelled"


def plan_dag() -> list[PlannedJob]:
    """Fan-out, fan-in, edges accepting failure or cancellation, failures on purpose, an always_run cleanup."""
    jobs = [PlannedJob(fails=False)]                                       # 0: the root
    fan_out = [len(jobs) + i for i in range(300)]
    jobs += [PlannedJob(fails=i % 10 == 3, parents=[0]) for i in range(300)]
    after = [len(jobs) + i for i in range(300)]                            # one child each, success only
    jobs += [PlannedJob(fails=i % 50 == 7, parents=[fan_out[i]]) for i in range(300)]
    jobs += [PlannedJob(fails=False, parents=[fan_out[i]], accept=("succeeded", "failed"))
             for i in range(0, 300, 3)]                                    # run whatever the parent did
    fan_in = [len(jobs) + i for i in range(30)]                            # ten of `after` each
    jobs += [PlannedJob(fails=False, parents=after[10 * i:10 * i + 10]) for i in range(30)]
    jobs += [PlannedJob(fails=False, parents=[fan_in[i]], accept=("cancelled",)) for i in range(30)]
    while len(jobs) < 999:                                                 # independent leaves
        jobs.append(PlannedJob(fails=len(jobs) % 17 == 0))
    jobs.append(PlannedJob(fails=False, parents=fan_in, always_run=True))  # cleanup
    return jobs


def expected_outcomes(jobs: list[PlannedJob]) -> list[str]:
    outcomes: list[str] = []
    for job in jobs:
        outcomes.append(job.outcome([outcomes[p] for p in job.parents]))
    return outcomes


def test_dag_ends_as_the_design_says_and_watch_tells_each_change_once(cluster: Cluster) -> None:
    jobs = plan_dag()
    expected = expected_outcomes(jobs)
    assert {"succeeded", "failed", "cancelled"} == set(expected)
    builder = corral.BatchBuilder("default", attributes={"test": "dag"})
    handles = []
    for job in jobs:
        handles.append(builder.job("busybox", "exit 1" if job.fails else "true", cores=0.25,
                                   parents=[handles[p] for p in job.parents], accept=job.accept,
                                   always_run=job.always_run))
    with cluster.client() as client:
        batch = client.submit(builder)
        first_job_id = 1  # the first update of a batch starts at job 1

        # Watch from the first event; after 300 events drop the stream and resume
        # on a new connection from the last id + 1, as a client that lost its
        # network would.
        events = []
        # Cost events too: a stream without them skips their ids.
        stream = client.watch(batch.batch_id, from_event_id=1, include_cost_events=True)
        for event in stream:
            events.append(event)
            if len(events) == 300:
                break
        stream.close()
    with cluster.client() as client:
        for event in client.watch(batch.batch_id, from_event_id=events[-1].event_id + 1, include_cost_events=True):
            events.append(event)
            if event.HasField("batch_completed"):
                break
        final = {j.job_id - first_job_id: j for j in client.jobs(batch.batch_id)}
        done = client.get_batch(batch.batch_id)

    assert done.state == batch_pb2.BATCH_STATE_COMPLETE
    assert {i: final[i].state for i in range(len(jobs))} == {i: FINAL[o] for i, o in enumerate(expected)}
    assert done.counts.n_succeeded == expected.count("succeeded")
    assert done.counts.n_failed == expected.count("failed")
    assert done.counts.n_cancelled == expected.count("cancelled")

    # Each change exactly once: ids 1..N, each job's changes a chain from the
    # state it was committed in to the final state ListJobs shows.
    assert [e.event_id for e in events] == list(range(1, len(events) + 1))
    assert events[-1].HasField("batch_completed")
    chains: dict[int, list[tuple[int, int]]] = {}
    for event in events:
        if event.HasField("job_state_changed"):
            change = event.job_state_changed
            chains.setdefault(change.job_id - first_job_id, []).append((change.old_state, change.new_state))
    assert set(chains) == set(range(len(jobs)))
    for index, chain in chains.items():
        for (_, before), (after, _) in zip(chain, chain[1:]):
            assert before == after, (index, chain)
        committed_state = job_state_pb2.JOB_STATE_READY if not jobs[index].parents else job_state_pb2.JOB_STATE_PENDING
        assert chain[0][0] == committed_state, (index, chain)
        assert chain[-1][1] == final[index].state, (index, chain)
    n_final = sum(1 for chain in chains.values() for _, new in chain if new in FINAL.values())
    assert n_final == len(jobs)


# ------------------------------------------------------------------ fair share


def test_two_users_share_the_cores_evenly(cluster: Cluster) -> None:
    tokens = {name: cluster.user(name) for name in ("ada", "grace")}
    n_jobs, seconds = 60, 1.0
    batch_ids: dict[str, int] = {}
    barrier = threading.Barrier(len(tokens))

    def submit(name: str) -> None:
        builder = corral.BatchBuilder("default", attributes={"test": "fair-share"})
        for _ in range(n_jobs):
            builder.job("busybox", f"sleep {seconds}", cores=1)
        with cluster.client(tokens[name]) as client:
            barrier.wait()
            batch_ids[name] = client.submit(builder).batch_id

    threads = [threading.Thread(target=submit, args=(name,)) for name in tokens]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with cluster.client() as client:
        completed = {name: client.wait(batch_id) for name, batch_id in batch_ids.items()}
    assert all(b.counts.n_succeeded == n_jobs for b in completed.values())

    # Core-seconds each user got while both had work waiting: from when both
    # had started running until the first of them started their last job.
    rows = cluster.query(
        """SELECT b.user, a.start_time_ms, a.end_time_ms, j.cores_mcpu
           FROM attempts a JOIN jobs j ON j.batch_id = a.batch_id AND j.job_id = a.job_id
           JOIN batches b ON b.batch_id = a.batch_id
           WHERE a.batch_id IN (%s, %s) AND a.start_time_ms IS NOT NULL""", list(batch_ids.values()))
    window_start = max(min(r["start_time_ms"] for r in rows if r["user"] == name) for name in tokens)
    window_end = min(max(r["start_time_ms"] for r in rows if r["user"] == name) for name in tokens)
    assert window_end - window_start > 3000, (window_start, window_end)
    used = {name: 0.0 for name in tokens}
    for r in rows:
        overlap_ms = min(r["end_time_ms"], window_end) - max(r["start_time_ms"], window_start)
        if overlap_ms > 0:
            used[r["user"]] += overlap_ms * r["cores_mcpu"] / 1e6
    even = sum(used.values()) / 2
    print(f"\ncore-seconds while both waited ({(window_end - window_start) / 1000:.1f} s): {used}")
    for name, core_s in used.items():
        assert abs(core_s - even) <= 0.15 * even, used


# ------------------------------------------------------------------ cancelling 100,000 jobs while some run


def driver_pids(cluster: Cluster) -> list[int]:
    pids = []
    for pid in cluster.descendants():
        with contextlib.suppress(OSError):
            if b"services.driver" in Path(f"/proc/{pid}/cmdline").read_bytes():
                pids.append(pid)
    return pids


def job_processes(batch_id: int) -> set[int]:
    """Processes running a job of the batch (their environment names it)."""
    mark = f"CORRAL_BATCH_ID={batch_id}".encode()
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if mark in (entry / "environ").read_bytes().split(b"\0"):
                    found.add(int(entry.name))
    return found


def jobs_checksum(cluster: Cluster) -> int:
    return cluster.query("CHECKSUM TABLE jobs")[0]["Checksum"]


@pytest.mark.timeout(600)
def test_cancel_a_100k_job_batch_while_its_jobs_run(cluster: Cluster) -> None:
    n_jobs, n_always_run = 100_000, 3
    builder = corral.BatchBuilder("default", attributes={"test": "cancel"})
    for _ in range(n_jobs - n_always_run):
        builder.job("busybox", "sleep 60", cores=1)
    for _ in range(n_always_run):
        builder.job("busybox", "true", cores=1, always_run=True)
    with cluster.client() as client:
        submitted_s = time.monotonic()
        batch_id = client.submit(builder).batch_id
        print(f"\nsubmitted {n_jobs:,} jobs in {time.monotonic() - submitted_s:.1f} s")
        eventually(lambda: client.get_batch(batch_id).counts.n_running >= MAX_WORKERS * WORKER_CORES // 2,
                   timeout_s=120, what="jobs of the batch running")
        # Running in the database comes first; the worker then starts the job's processes.
        running_before = eventually(lambda: job_processes(batch_id), timeout_s=60, what="job processes")

        # With the drivers stopped, only the cancel call can touch the
        # database: it must not change a single job row.
        drivers = driver_pids(cluster)
        assert len(drivers) == 2
        for pid in drivers:
            os.kill(pid, signal.SIGSTOP)
        try:
            before = jobs_checksum(cluster)
            called_ms = time.time_ns() // 1_000_000
            cancelled = client.cancel_batch(batch_id, reason="e2e: cancel while running")
            returned_ms = time.time_ns() // 1_000_000
            assert jobs_checksum(cluster) == before
            # Dispatched already: a worker may still start these (the canceller of Creating jobs stops them).
            dispatched = {r["job_id"] for r in cluster.query(
                "SELECT job_id FROM attempts WHERE batch_id = %s", (batch_id,))}
        finally:
            for pid in drivers:
                os.kill(pid, signal.SIGCONT)
        print(f"CancelBatch of {n_jobs:,} jobs returned in {returned_ms - called_ms} ms")
        assert cancelled.cancellation.cancelled_by == "admin"

        done = client.wait(batch_id)
    assert done.state == batch_pb2.BATCH_STATE_COMPLETE
    assert done.counts.n_succeeded == n_always_run
    assert done.counts.n_cancelled == n_jobs - n_always_run

    # No job was dispatched after the call returned, except the always_run ones (a job dispatched before it
    # may start after it, on a busy worker); the running ones were stopped and their processes are gone.
    late = cluster.query(
        """SELECT j.job_id, j.always_run FROM attempts a
           JOIN jobs j ON j.batch_id = a.batch_id AND j.job_id = a.job_id
           WHERE a.batch_id = %s AND a.start_time_ms > %s""", (batch_id, returned_ms))
    assert late and all(r["always_run"] or r["job_id"] in dispatched for r in late), (late, sorted(dispatched))
    assert any(r["always_run"] for r in late)
    stopped = cluster.query(
        """SELECT a.reason, a.end_time_ms FROM attempts a JOIN jobs j ON j.batch_id = a.batch_id AND j.job_id = a.job_id
           WHERE a.batch_id = %s AND a.start_time_ms IS NOT NULL AND NOT j.always_run""", (batch_id,))
    assert stopped and all(r["reason"] == "cancelled" and r["end_time_ms"] is not None for r in stopped), stopped
    eventually(lambda: not job_processes(batch_id), timeout_s=30, what="the batch's processes to be gone")


# ------------------------------------------------------------------ workers come and go


def test_workers_leave_when_idle_and_a_killed_workers_job_runs_again(cluster: Cluster) -> None:
    # Nothing to run: every worker exits after the idle timeout.
    eventually(lambda: not cluster.worker_pids(), timeout_s=90, what="idle workers to exit")
    assert not cluster.query("SELECT name FROM instances WHERE state IN ('pending', 'active')")

    builder = corral.BatchBuilder("default", attributes={"test": "sigkill"})
    builder.job("busybox", "sleep 5", cores=1, max_attempts=3)
    with cluster.client() as client:
        batch_id = client.submit(builder).batch_id
        [job] = list(client.jobs(batch_id))

        def first_attempt() -> dict | None:
            rows = cluster.query("SELECT instance_name FROM attempts WHERE batch_id = %s AND job_id = %s "
                                 "AND start_time_ms IS NOT NULL", (batch_id, job.job_id))
            return rows[0] if rows else None

        # The autoscaler started a worker for it.
        instance = eventually(first_attempt, timeout_s=60, what="the job to start")["instance_name"]
        pid = eventually(lambda: cluster.worker_pids().get(instance), timeout_s=10, what=f"the pid of {instance}")
        os.kill(pid, signal.SIGKILL)

        done = client.wait(batch_id)
        again = client.get_job(batch_id, job.job_id)
    assert done.counts.n_succeeded == 1
    assert len(again.attempts) == 2, again.attempts
    lost, rerun = sorted(again.attempts, key=lambda a: a.started_at.ToMilliseconds())
    assert lost.instance_name == instance and rerun.instance_name != instance
    assert lost.end_reason == job_pb2.ATTEMPT_END_REASON_WORKER_LOST
    assert rerun.end_reason == job_pb2.ATTEMPT_END_REASON_EXITED and again.state == job_state_pb2.JOB_STATE_SUCCEEDED
    rows = cluster.query("SELECT state, deactivation_reason FROM instances WHERE name = %s", (instance,))
    assert rows[0]["state"] == "inactive", rows
