"""A restarted `corral up` logs nobody out and resumes what ran: the user's profile stays current and follows
the new ports, the `admin` profile it rewrites is the way back to the administrator, no machine is started
while it stops (Ctrl-C), and a job that was running runs again within seconds of the restart."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

import corral
from tests.e2e import cluster as up
from tests.e2e.cluster import eventually

RESUMED_WITHIN_S = 10.0
"""How soon after the restarted `corral up` is ready the running job's new attempt must start (issue 36)."""


def whoami(cluster: up.Cluster, *options: str) -> str:
    result = cluster.cli(*options, "whoami")
    assert result.returncode == 0, result.stderr
    return result.stdout.split()[0]


def started_attempts(cluster: up.Cluster, batch_id: int) -> list[dict]:
    return cluster.query("SELECT attempt_id, instance_name, start_time_ms, end_time_ms, reason FROM attempts "
                         "WHERE batch_id = %s AND start_time_ms IS NOT NULL ORDER BY start_time_ms", (batch_id,))


@pytest.mark.timeout(420)
def test_a_restart_keeps_the_users_login_and_resumes_running_work(tmp_path: Path) -> None:
    first = up.start(tmp_path)
    try:
        login = first.cli("login", "--token", first.user("alice"))
        assert login.returncode == 0, login.stderr
        assert whoami(first) == "alice"
        builder = corral.BatchBuilder("default")
        builder.job("busybox", "sleep 15", cores=1)
        with first.client() as admin:
            batch_id = admin.submit(builder).batch_id
        eventually(lambda: started_attempts(first, batch_id), timeout_s=60, what="the job to run")
    finally:
        # Ctrl-C, as the user stops it.
        interrupted_ms = time.time() * 1000
        first.process.send_signal(signal.SIGINT)
        assert first.wait() == 0
    restarted_ms = time.time() * 1000
    second = up.start(tmp_path)  # the same data directory and CLI configuration, new ports
    ready_ms = time.time() * 1000
    try:
        assert second.frontend != first.frontend
        assert second.said("'alice' stays current"), second.output
        assert whoami(second) == "alice"
        assert whoami(second, "--profile", "admin") == "admin"

        created = second.query("SELECT name, time_created_ms FROM instances WHERE time_created_ms BETWEEN %s AND %s",
                               (interrupted_ms, restarted_ms))
        assert created == [], "machines were started while corral up stopped"

        def resumed() -> dict | None:
            return next((a for a in started_attempts(second, batch_id) if a["start_time_ms"] >= restarted_ms), None)

        attempt = eventually(resumed, timeout_s=max(1.0, (ready_ms + RESUMED_WITHIN_S * 1000 - time.time() * 1000)
                                                     / 1000),
                             what=f"the job's new attempt within {RESUMED_WITHIN_S:g} s of the restart")
        assert attempt["start_time_ms"] <= ready_ms + RESUMED_WITHIN_S * 1000, (attempt, ready_ms)
        print(f"restart: ready {(ready_ms - restarted_ms) / 1000:.1f} s after it began; the new attempt started "
              f"{(attempt['start_time_ms'] - ready_ms) / 1000:+.1f} s from ready")
        with second.client() as admin:
            assert admin.wait(batch_id).counts.n_succeeded == 1
        lost = [a for a in started_attempts(second, batch_id) if a["attempt_id"] != attempt["attempt_id"]]
        assert lost and all(a["end_time_ms"] is not None for a in lost), lost
    finally:
        assert second.stop() == 0
