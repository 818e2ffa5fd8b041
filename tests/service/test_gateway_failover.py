"""A real worker behind the internal gateway (the real Envoy on its generated config): given only the
gateway's address, it activates, opens its session with the leader, and when the leader steps down it
finds the new one through the same address, its running job untouched. The time it took is printed."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from services.db.database import DatabaseConfig
from tests.envoy_gateway import gateway_deployment, running
from tests.service.test_worker import (  # noqa: F401 - fixtures shared with test_worker.py
    WAIT_FOR_GO,
    Cluster,
    cluster,
    eventually,
    leading_driver,
    make_cluster,
    script,
)

pytestmark = pytest.mark.timeout(180)


async def test_a_worker_behind_the_gateway_follows_the_leader(cluster: Cluster, db_config: DatabaseConfig,
                                                              tmp_path: Path) -> None:
    leader = cluster.driver
    standby = await leading_driver(db_config, cluster.certs, tmp_path, "driver-b")
    cluster.drivers.append(standby)
    await eventually(lambda: standby.election.state.leader == f"localhost:{leader.port}", what="standby")
    assert leader.sessions is not None and standby.sessions is not None
    deployment = gateway_deployment(tmp_path / "gateway", cluster.certs, 1, [1], [leader.port, standby.port])
    async with running(deployment, tmp_path / "gateway", "internal", healthy=("driver",)) as (_, port):
        gateway = f"localhost:{port}"
        worker = await cluster.worker("w1", driver_addresses=(gateway,))
        assert worker.worker.driver_address == gateway
        assert "w1" in leader.sessions.connected_instances()
        batch_id, [job_id] = await cluster.submit(script(f"{WAIT_FOR_GO}; echo still here"))
        attempt = await cluster.started(batch_id, job_id)
        opened = worker.worker.sessions_opened

        stepped_down = time.monotonic()
        await leader.stop()  # gives its lease up: the standby leads at its next look
        await eventually(lambda: "w1" in standby.sessions.connected_instances() and worker.worker.connected
                         and worker.worker.sessions_opened > opened, 60, "the worker's session with the new leader")
        print(f"the worker's session reached the new leader through the gateway "
              f"{time.monotonic() - stepped_down:.2f} s after the old leader stepped down")
        assert worker.worker.driver_address == gateway  # never the driver's own address
        cluster.driver = standby  # the test reads the database through the leading driver's pool

        await cluster.go(attempt)
        job = await cluster.final(batch_id, job_id)
        assert job["state"] == "Success"
        assert [a["attempt_id"] for a in await cluster.attempts(batch_id, job_id)] == [attempt["attempt_id"]]
        await worker.stop()  # while the gateway still serves: it deactivates through it
