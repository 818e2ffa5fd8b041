"""A spending limit that is never overshot, on real processes (`corral up`):
two users submit 100 jobs each at once to a project with a limit, jobs of
random lengths and timeouts (some run past their timeout and are killed).
Afterwards the project's spend is within its limit to the micro-dollar, at
least 80% of the limit was used, and every job that did not run says why
(ExplainJob: it waits for the billing limit, or was cancelled because its
worst case can never fit what the limit leaves). With the limit lowered below the spend, a
new batch is refused with FAILED_PRECONDITION and nothing is written."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator

import pytest

import corral
from corral.batch.v1 import job_explanation_pb2
from tests.e2e import cluster as up
from tests.e2e.cluster import Cluster, eventually

LIMIT_USD = 0.003
"""About 14 jobs' worst cases at once (a core for their timeout and 15 s more), and some 130 jobs' real cost."""
JOBS_PER_USER = 100


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = up.start(tmp_path_factory.mktemp("budget"), "--worker-cores", "4", "--max-workers", "2")
    yield from up.running(cluster)


@pytest.mark.timeout(900)
def test_a_limit_is_used_and_never_overshot(cluster: Cluster) -> None:
    tokens = {name: cluster.user(name) for name in ("ada", "grace")}
    with cluster.client() as admin:
        admin.create_billing_project("capped", members=list(tokens), limit_usd=LIMIT_USD)
    rng = random.Random(11)
    batch_ids: dict[str, int] = {}
    barrier = threading.Barrier(len(tokens))

    def submit(name: str) -> None:
        builder = corral.BatchBuilder("capped", attributes={"test": "budget"})
        for _ in range(JOBS_PER_USER):
            seconds, timeout = rng.uniform(0.5, 3.0), rng.choice([2, 3, 4, 5])
            builder.job("busybox", f"sleep {seconds:.2f}", cores=1, timeout_s=timeout)
        with cluster.client(tokens[name]) as client:
            barrier.wait()
            batch_ids[name] = client.submit(builder).batch_id

    threads = [threading.Thread(target=submit, args=(name,)) for name in tokens]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ids = list(batch_ids.values())

    def states() -> dict[str, int]:
        rows = cluster.query("SELECT state, COUNT(*) n FROM jobs WHERE batch_id IN (%s, %s) GROUP BY state", ids)
        return {r["state"]: r["n"] for r in rows}

    def settled() -> bool:
        """Nothing runs any more, and what is left waits (the limit leaves too little to start one): nothing
        runs now, nor 8 s (several scheduling cycles) later, and no job changed state in between. (A moment
        between one attempt's end and the next one's start looks settled too.)"""
        before = states()
        if before.get("Running") or before.get("Creating") or not (before.get("Success") or before.get("Failed")):
            return False
        time.sleep(8)
        return states() == before

    eventually(settled, 600, 1.0, "the project's jobs to stop running")

    with cluster.client() as admin:
        project = admin.billing_project("capped")
        spend = cluster.query(
            "SELECT COALESCE(SUM(a.`usage` * r.rate_usd), 0) usd FROM aggregated_billing_project_resources a "
            "JOIN resources r ON r.resource_id = a.resource_id WHERE a.billing_project = 'capped'")[0]["usd"]
        print(f"\nspend ${spend:.6f} of ${LIMIT_USD:.6f} ({spend / LIMIT_USD:.1%}); "
              f"reported {project.spend_micro_usd} micro-USD, reserved {project.reserved_micro_usd}")
        assert spend <= LIMIT_USD
        assert project.spend_micro_usd <= LIMIT_USD * 1_000_000 and project.reserved_micro_usd == 0
        assert spend >= 0.8 * LIMIT_USD

        # What did not run waits for the limit, or was cancelled because it never can fit what is left.
        left = cluster.query("SELECT batch_id, job_id, state FROM jobs WHERE batch_id IN (%s, %s) "
                             "AND state IN ('Ready', 'Cancelled')", ids)
        ran = cluster.query("SELECT COUNT(*) n FROM jobs WHERE batch_id IN (%s, %s) AND state IN "
                            "('Success', 'Failed', 'Error')", ids)[0]["n"]
        n_cancelled = sum(r["state"] == "Cancelled" for r in left)
        print(f"{ran} jobs ran, {len(left) - n_cancelled} wait, {n_cancelled} cancelled as never fitting")
        assert left and ran + len(left) == 2 * JOBS_PER_USER
        for row in left:
            [reason] = admin.explain_job(row["batch_id"], row["job_id"]).reasons
            if row["state"] == "Ready":
                assert reason.code == job_explanation_pb2.WAIT_REASON_CODE_BILLING_LIMIT_REACHED, reason
                assert "billing project capped" in reason.detail
            else:
                assert reason.code == job_explanation_pb2.WAIT_REASON_CODE_FINISHED, reason
                assert "it can never run under the limit of billing project capped" in reason.detail

        # An administrator lowers the limit below the spend: the project takes no new batch, and writes none.
        admin.set_limit("capped", spend / 2)
        before = cluster.query("SELECT COUNT(*) n FROM batches WHERE billing_project = 'capped'")[0]["n"]
        with pytest.raises(corral.errors.FailedPrecondition, match=r"billing project capped has spent \$0\.00"):
            with cluster.client(tokens["ada"]) as client:
                builder = corral.BatchBuilder("capped")
                builder.job("busybox", "true", cores=1, timeout_s=2)
                client.submit(builder)
        assert cluster.query("SELECT COUNT(*) n FROM batches WHERE billing_project = 'capped'")[0]["n"] == before
