"""Retries that know why, on real processes (`corral up`, local workers of
two cores): a job killed for memory runs again with twice the memory and
succeeds; a job whose exit code its policy lists is retried after growing,
jittered delays, recorded on its attempts; a worker SIGKILLed under a job
makes a new attempt on another worker that is not counted as a failure;
after two preemptions (SIGUSR1, a local worker's preemption notice) a job
of a spot pool runs on an on-demand machine; `corral logs -f` on a job that
has not started waits for it and follows each of its attempts."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest
from google.protobuf import duration_pb2

import corral
from corral.batch.v1 import job_spec_pb2
from tests.e2e import cluster as up
from tests.e2e.cluster import Cluster, eventually

MIB = 2**20


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = up.start(tmp_path_factory.mktemp("retries"), "--worker-cores", "2", "--max-workers", "3",
                       "--heartbeat-timeout", "5")
    yield from up.running(cluster)


def attempts(cluster: Cluster, batch_id: int, job_id: int) -> list[dict[str, Any]]:
    return cluster.query(
        "SELECT a.attempt_id, a.instance_name, a.start_time_ms, a.end_time_ms, a.reason, a.retry_reason, "
        "a.retry_delay_ms, i.preemptible FROM attempts a JOIN instances i ON i.name = a.instance_name "
        "WHERE a.batch_id = %s AND a.job_id = %s ORDER BY a.start_time_ms IS NULL, a.start_time_ms, a.end_time_ms",
        [batch_id, job_id])


def started_on(cluster: Cluster, batch_id: int, job_id: int, n: int) -> str:
    """The instance running the job's n-th attempt, once it started."""
    def running() -> str | None:
        rows = cluster.query("SELECT a.instance_name FROM attempts a JOIN jobs j ON j.batch_id = a.batch_id "
                             "AND j.job_id = a.job_id AND j.attempt_id = a.attempt_id AND j.state = 'Running' "
                             "WHERE a.batch_id = %s AND a.job_id = %s AND a.start_time_ms IS NOT NULL "
                             "AND a.end_time_ms IS NULL AND j.n_attempts = %s", [batch_id, job_id, n])
        return rows[0]["instance_name"] if rows else None
    return eventually(running, 120, 0.1, f"attempt {n} of job {job_id} running")


@pytest.mark.timeout(300)
def test_out_of_memory_and_listed_exit_codes_are_retried(cluster: Cluster) -> None:
    builder = corral.BatchBuilder("default", attributes={"test": "retries"})
    # 600 MiB under a 512 MiB limit fails; the retry has 1 GiB.
    builder.job("busybox", ["/usr/bin/python3", "-c", "b = bytearray(600 * 2**20); print('allocated', len(b))"],
                memory_bytes=512 * MIB, max_attempts=3,
                retry_policy=job_spec_pb2.RetryPolicy(retry_oom_with_memory_factor=2.0))
    builder.job("busybox", "exit 3", max_attempts=5, retry_policy=job_spec_pb2.RetryPolicy(
        max_failed_retries=3, retry_exit_codes=[3], retry_delay=duration_pb2.Duration(seconds=1)))
    with cluster.client() as client:
        batch_id = client.submit(builder).batch_id
        done = client.wait(batch_id)
        oom_job = client.get_job(batch_id, 1)
    assert (done.counts.n_succeeded, done.counts.n_failed) == (1, 1), oom_job

    assert [a.memory_bytes for a in oom_job.attempts] == [512 * MIB, 1024 * MIB]
    first = oom_job.attempts[0]
    assert first.retry_reason == "out of memory at 512 MiB: retried with 1024 MiB"
    assert oom_job.attempts[1].exit_code == 0

    tries = attempts(cluster, batch_id, 2)
    assert len(tries) == 4 and [t["reason"] for t in tries] == ["exited"] * 4
    delays = [t["retry_delay_ms"] for t in tries]
    assert delays[3] is None
    for k, delay in enumerate(delays[:3]):
        assert 1000 * 2**k / 2 <= delay <= 1000 * 2**k, delays
    for before, after, delay in zip(tries, tries[1:], delays):
        assert after["start_time_ms"] - before["end_time_ms"] >= delay  # the back-off was waited out
    shown = cluster.cli("job", str(batch_id), "1")
    assert "next attempt: out of memory at 512 MiB: retried with 1024 MiB" in shown.stdout, shown


@pytest.mark.timeout(300)
def test_a_killed_worker_is_not_a_failure(cluster: Cluster) -> None:
    builder = corral.BatchBuilder("default", attributes={"test": "lost-worker"})
    builder.job("busybox", "sleep 4", max_attempts=2)
    with cluster.client() as client:
        batch_id = client.submit(builder).batch_id
        victim = started_on(cluster, batch_id, 1, 1)
        os.kill(cluster.worker_pids()[victim], signal.SIGKILL)
        done = client.wait(batch_id)
    assert done.counts.n_succeeded == 1
    first, second = attempts(cluster, batch_id, 1)
    assert (first["instance_name"], first["reason"], first["retry_reason"]) == (
        victim, "worker_lost", "its worker was lost: not a failure")
    assert second["instance_name"] != victim and second["reason"] == "exited"
    job = cluster.query("SELECT n_failed_retries FROM jobs WHERE batch_id = %s AND job_id = 1", [batch_id])[0]
    assert job["n_failed_retries"] == 0


@pytest.mark.timeout(400)
def test_after_two_preemptions_a_job_runs_on_demand(cluster: Cluster) -> None:
    # The operator makes the highmem pool (which no other test here uses, so it has no machine yet) a spot
    # pool: its new machines are preemptible.
    cluster.execute("UPDATE instance_collections SET preemptible = TRUE WHERE name = 'highmem'")
    try:
        builder = corral.BatchBuilder("default", attributes={"test": "preemption"})
        builder.job("busybox", "sleep 5", memory_bytes=6 * 2**30, max_attempts=5,
                    retry_policy=job_spec_pb2.RetryPolicy(max_preemptions_before_on_demand=2))
        with cluster.client() as client:
            batch_id = client.submit(builder).batch_id
            for n in (1, 2):
                spot = started_on(cluster, batch_id, 1, n)
                assert cluster.query("SELECT preemptible FROM instances WHERE name = %s", [spot])[0]["preemptible"]
                os.kill(cluster.worker_pids()[spot], signal.SIGUSR1)  # the cloud reclaims the machine
            done = client.wait(batch_id)
            job = client.get_job(batch_id, 1)
    finally:
        cluster.execute("UPDATE instance_collections SET preemptible = FALSE WHERE name = 'highmem'")
    assert done.counts.n_succeeded == 1
    tries = attempts(cluster, batch_id, 1)
    assert [t["reason"] for t in tries] == ["preempted", "preempted", "exited"]
    assert [bool(t["preemptible"]) for t in tries] == [True, True, False]
    assert tries[1]["retry_reason"] == "preempted (2 so far): not a failure; on-demand machines from now on"
    assert [a.spot for a in job.attempts] == [True, True, False]


@pytest.mark.timeout(180)
def test_logs_follow_waits_for_a_pending_job_and_follows_each_attempt(cluster: Cluster) -> None:
    """`corral logs -f` on a job whose parent still runs waits for it, prints each attempt's log under a
    line naming the attempt, and returns when the job has ended."""
    builder = corral.BatchBuilder("default", attributes={"test": "follow"})
    parent = builder.job("busybox", "sleep 6")
    builder.job("busybox", 'echo "try $CORRAL_ATTEMPT_ID"; exit 3', parents=[parent], max_attempts=2,
                retry_policy=job_spec_pb2.RetryPolicy(max_failed_retries=1, retry_exit_codes=[3],
                                                      retry_delay=duration_pb2.Duration(seconds=1)))
    with cluster.client() as client:
        batch_id = client.submit(builder).batch_id
    followed = cluster.cli("logs", "-f", str(batch_id), "2", timeout_s=120)
    assert followed.returncode == 0, followed.stderr
    tries = attempts(cluster, batch_id, 2)
    assert len(tries) == 2
    assert followed.stdout == "".join(f"try {t['attempt_id']}\n" for t in tries)
    assert followed.stderr.splitlines() == [
        f"job 2 of batch {batch_id} has not run yet: waiting for it to start (Ctrl-C to stop)",
        *(f"--- attempt {n} ({t['attempt_id']}) on {t['instance_name']} ---" for n, t in enumerate(tries, 1)),
        "--- job 2 failed ---"]
