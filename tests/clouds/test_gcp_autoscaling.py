"""The autoscaler and the reconciler driving the real GCP provider (google-cloud-compute against the loopback
Compute Engine of tests/clouds/gcp_api.py) on the real database: quota exhausted in one region sends a
region-agnostic machine to the other, where the instance is recorded, scheduled and billed; a machine the
database does not know is deleted after its grace; one the cloud lost is deactivated and its job runs
again."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
from google.auth.credentials import AnonymousCredentials

from services.db.invariants import check_invariants
from services.db.plan_snapshot import read_workers
from services.driver.autoscaler import Autoscaler
from services.driver.pricing import price_file
from services.driver.pricing.refresh import sync_price_file
from services.driver.providers.gcp import GcpProvider
from services.driver.providers.gcp_shapes import GIB
from services.driver.providers.interface import InstanceRequest
from services.driver.reconciler import InstanceReconciler, ReconcileSettings
from services.policy.placement import Backoff, BackoffSettings
from tests.clouds.gcp_api import GcpApi
from tests.clouds.test_gcp_provider import api, config  # noqa: F401 - api: a fixture
from tests.world import World

BACKOFF = BackoffSettings(region=Backoff(60, 600), transient=Backoff(10, 100), configuration=Backoff(300, 3000))
GRACE = ReconcileSettings(period_s=1, vanished_grace_s=120, orphan_grace_s=300)


@pytest.fixture
def gcp(api: GcpApi) -> Iterator[GcpProvider]:
    provider = GcpProvider(config(api), AnonymousCredentials())
    try:
        yield provider
    finally:
        provider.close()


@pytest.fixture
async def deployment(world: World, gcp: GcpProvider) -> World:
    """The database as a GCP deployment has it: its regions, and its machines' prices from the price file."""
    await world.db.execute("DELETE FROM regions")
    await world.db.execute("INSERT INTO regions (region_id, name) VALUES (0, 'us-central1'), (1, 'europe-west4')")
    await sync_price_file(world.store, price_file.load(), gcp.machine_kinds())
    return world


async def test_quota_exhausted_in_one_region_moves_the_machine_and_records_where_it_went(
        deployment: World, api: GcpApi, gcp: GcpProvider) -> None:
    world = deployment
    api.set_quota("us-central1", "CPUS", 0)
    anywhere, _, job = await world.batch([{"cores_mcpu": 1000}])
    scaler = Autoscaler(world.store, gcp, lambda: world.epoch, region="us-central1", any_region=True,
                        backoff=BACKOFF, clock_s=lambda: 1000.0)
    await scaler.cycle()
    [created] = scaler.created  # asked for in us-central1, put in europe-west4 by the provider in the same call
    assert len(api.calls("instances.insert")) == 1
    zone = api.instances()[created]["zone"].rsplit("/", 1)[-1]
    assert zone.startswith("europe-west4-")
    row = await world.db.fetchone("SELECT region, cpu_product, memory_product, state FROM instances WHERE name = %s",
                                  (created,))
    assert row == {"region": "europe-west4", "cpu_product": "cpu/gcp/n2-ondemand/europe-west4",
                   "memory_product": "memory/gcp/n2-ondemand/europe-west4", "state": "pending"}
    # Its worker activates; the region-agnostic job runs there, billed at that region's price.
    token = await world.db.fetchone("SELECT activation_token FROM instances WHERE name = %s", (created,))
    assert token is not None
    await world.store.activate_instance(world.epoch, created, token["activation_token"])
    attempt = await world.run(anywhere, job, instance=created, instance_products=True)
    resources = await world.db.fetchall(
        "SELECT r.name FROM attempt_resources ar JOIN resources r ON r.resource_id = ar.resource_id "
        "WHERE ar.batch_id = %s AND ar.attempt_id = %s ORDER BY r.name", (anywhere, attempt))
    assert [r["name"] for r in resources] == ["cpu/gcp/n2-ondemand/europe-west4/1",
                                              "memory/gcp/n2-ondemand/europe-west4/1"]
    # The scheduler's planner sees it in europe-west4 (region bit 1), so it places there no job bound to
    # us-central1 (bit 0).
    [worker] = (await read_workers(world.db, "standard"))["standard"]
    assert (worker.name, worker.region_id) == (created, 1)
    assert await check_invariants(world.db) == []


async def test_an_orphan_is_deleted_and_a_vanished_machines_job_runs_again(
        deployment: World, api: GcpApi, gcp: GcpProvider) -> None:
    world = deployment
    # A machine the cloud runs that the database does not know (a create whose answer was lost).
    await gcp.create(InstanceRequest("standard-orphan", "standard", 2000, 8 * GIB, "us-central1", "t" * 32))
    # A machine the database has as active, running a job, that the cloud then loses.
    request = InstanceRequest("standard-lost", "standard", 2000, 8 * GIB, "us-central1", "u" * 32)
    machine = gcp.machine(request)
    await world.store.create_instance(world.epoch, request.name, "standard", 2000, request.activation_token,
                                      region="us-central1", products=(machine.cpu_product, machine.memory_product))
    await gcp.create(request)
    await world.store.activate_instance(world.epoch, request.name, request.activation_token)
    batch_id, _, job = await world.batch([{"cores_mcpu": 1000}])
    await world.run(batch_id, job, instance=request.name, instance_products=True)
    await gcp.delete(request.name)

    reconciler = InstanceReconciler(world.store, gcp, lambda: world.epoch, GRACE, clock_ms=world.clock)
    world.clock.advance(int(GRACE.vanished_grace_s * 1000))
    await reconciler.cycle()
    assert await world.store.instance_state(request.name) == "inactive"
    assert await world.state(batch_id, job) == "Ready"  # to run again, as a new attempt
    assert "standard-orphan" in api.instances()  # within its grace
    world.clock.advance(int(GRACE.orphan_grace_s * 1000))
    await reconciler.cycle()
    assert "standard-orphan" not in api.instances()
    assert await check_invariants(world.db) == []


def test_the_products_follow_the_pools_family_and_a_named_machine_type(gcp: GcpProvider) -> None:
    request = InstanceRequest("x", "highmem", 2000, 8 * GIB, "us-central1", "t", preemptible=True)
    assert gcp.machine(request).cpu_product == "cpu/gcp/n2-spot/us-central1"
    named = dataclasses.replace(request, machine_type="c3-highcpu-4", preemptible=False)
    assert gcp.machine(named).cpu_product == "cpu/gcp/c3-ondemand/us-central1"
    assert {m.region for m in gcp.machine_kinds()} == {"us-central1", "europe-west4"}
