"""FleetService over real gRPC: the pools as `instance_collections` holds them, with their instances
counted by state; the instances filtered by pool and state, in pages; administrators only. And `corral
admin pools` / `corral admin instances` as a real subprocess against the same frontend.

Instances are created, activated, given an attempt and deactivated by the driver's procedures on the
same database (`tests.world.World`); the expected pools are migration 0002's local defaults.
"""

from __future__ import annotations

from pathlib import Path

import grpc

from corral.batch.v1 import fleet_pb2, fleet_service_pb2_grpc
from corral.batch.v1 import fleet_service_pb2 as pb
from corral.cli_common import EXIT_PERMISSION_DENIED
from services.auth.app import AuthApp
from services.common.tls import DevCertificateAuthority
from tests.service.conftest import person_channel
from tests.service.test_cli import corral, logged_in
from tests.service.test_jobs import Env, env, refused, spec, violations  # noqa: F401 - env is a fixture
from tests.world import World

GIB = 1 << 30
ACTIVE, PENDING, INACTIVE, DELETED = (fleet_pb2.INSTANCE_STATE_ACTIVE, fleet_pb2.INSTANCE_STATE_PENDING,
                                      fleet_pb2.INSTANCE_STATE_INACTIVE, fleet_pb2.INSTANCE_STATE_DELETED)


async def machines(env: Env) -> tuple[World, int]:
    """standard: i1 active running one job, i3 pending, i4 deactivated, i5 deleted; highmem: i2 active. Returns
    the world and the batch whose job runs on i1."""
    w = env.world
    await w.instance("i1", 4000)
    await w.instance("i2", 2000, "highmem")
    await w.store.create_instance(w.epoch, "i3", "standard", 2000, "tok-i3")
    for name in ("i4", "i5"):
        await w.instance(name, 2000)
        await w.store.deactivate_instance(w.epoch, name, "idle")
    # Nothing marks an instance deleted yet (the schema has the state; the reconciler may one day).
    await w.db.execute("UPDATE instances SET state = 'deleted' WHERE name = 'i5'")
    batch_id = await env.submit(spec())
    attempt = await w.run(batch_id, 1, instance="i1")
    w.clock.advance(5000)
    await w.store.heartbeat_rollup(w.epoch, "i1", [{"batch_id": batch_id, "job_id": 1, "attempt_id": attempt,
                                                     "rollup_time_ms": w.clock()}])
    return w, batch_id


async def test_pools_with_counts_and_instances_by_pool_and_state(env: Env, certs: DevCertificateAuthority) -> None:
    w, _ = await machines(env)
    root = env.as_("root")
    async with person_channel(certs.issue("someone"), env.frontend.public_port) as channel:
        fleet = fleet_service_pb2_grpc.FleetServiceStub(channel)
        pools = {p.name: p for p in (await fleet.ListPools(pb.ListPoolsRequest(), metadata=root)).pools}
        assert list(pools) == ["highcpu", "highmem", "job-private", "standard"]
        standard = pools["standard"]
        assert (standard.shared, standard.provider, standard.machine_type, standard.cores_mcpu, standard.memory_bytes,
                standard.storage_bytes, standard.spot, standard.max_instances, standard.enabled) == (
            True, "local", "standard", 2000, 8 * GIB, 16 * GIB, False, 4, True)
        assert (standard.n_pending, standard.n_active, standard.n_inactive) == (1, 1, 1)  # i5, deleted, is not counted
        assert (pools["highmem"].n_active, pools["highcpu"].n_active) == (1, 0)
        private = pools["job-private"]
        assert (private.shared, private.cores_mcpu, private.machine_type, private.max_instances) == (False, 0, "", 4)

        async def names(**request) -> list[str]:
            found, token = [], ""
            while True:
                page = await fleet.ListInstances(pb.ListInstancesRequest(page_token=token, **request), metadata=root)
                found += [i.name for i in page.instances]
                token = page.next_page_token
                if not token:
                    return found

        assert await names() == ["i1", "i2", "i3", "i4"]
        assert await names(page_size=1) == ["i1", "i2", "i3", "i4"]
        assert await names(pool="standard") == ["i1", "i3", "i4"]
        assert await names(state=ACTIVE) == ["i1", "i2"]
        assert await names(pool="standard", state=PENDING) == ["i3"]
        assert await names(state=DELETED) == ["i5"]
        assert await names(pool="nonesuch") == []

        listed = {i.name: i for i in (await fleet.ListInstances(pb.ListInstancesRequest(), metadata=root)).instances}
        rows = {r["name"]: r for r in await w.db.fetchall("SELECT * FROM instances")}
        i1 = listed["i1"]
        assert (i1.pool, i1.state, i1.region, i1.cores_mcpu, i1.n_running_attempts) == (
            "standard", ACTIVE, "local", 4000, 1)
        assert 0 < i1.free_cores_mcpu == rows["i1"]["free_cores_mcpu"] < 4000  # its job's cores are taken
        assert i1.last_heartbeat_at.ToMilliseconds() == rows["i1"]["last_heartbeat_ms"] == w.clock()
        assert i1.created_at.ToMilliseconds() == rows["i1"]["time_created_ms"] and i1.HasField("activated_at")
        i3 = listed["i3"]
        assert (i3.state, i3.HasField("activated_at"), i3.HasField("last_heartbeat_at"), i3.n_running_attempts) == (
            PENDING, False, False, 0)
        i4 = listed["i4"]
        assert (i4.state, i4.HasField("free_cores_mcpu"), i4.deactivation_reason, i4.n_running_attempts) == (
            INACTIVE, False, "idle", 0)
        assert i4.HasField("deactivated_at") and not i1.HasField("deactivated_at")

        for request, field in ((pb.ListInstancesRequest(state=9), "state"),
                               (pb.ListInstancesRequest(page_token="%%"), "page_token"),
                               (pb.ListInstancesRequest(page_size=-1), "page_size")):
            bad = await refused(fleet.ListInstances(request, metadata=root))
            assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT and violations(bad) == [field]
        # Anybody but an administrator: refused, before any field is read.
        for who in ("alice", "bob", "carol"):
            for call in (fleet.ListPools(pb.ListPoolsRequest(), metadata=env.as_(who)),
                         fleet.ListInstances(pb.ListInstancesRequest(state=9), metadata=env.as_(who))):
                assert (await refused(call)).code() == grpc.StatusCode.PERMISSION_DENIED


async def test_corral_admin_pools_and_instances(env: Env, auth_app: AuthApp, certs: DevCertificateAuthority,
                                                tmp_path: Path) -> None:
    await machines(env)
    lines: dict[str, list[str]] = {}
    for who in ("admin", "dave"):
        cli = await logged_in(who, env.frontend.public_port, auth_app, certs, tmp_path, admin=who == "admin")
        if who == "dave":
            refused_ = await corral(cli, "admin", "pools")
            assert refused_.returncode == EXIT_PERMISSION_DENIED and "not an administrator" in refused_.stderr
            continue
        for args in (("pools",), ("instances", "--pool", "standard"), ("instances", "--state", "active")):
            done = await corral(cli, "admin", *args)
            assert done.returncode == 0, done.stderr
            lines[" ".join(args)] = done.stdout.splitlines()
    assert [line.split()[0] for line in lines["pools"]] == ["highcpu", "highmem", "job-private", "standard"]
    assert lines["pools"][3] == ("standard  local  standard  cores=2 memory=8Gi storage=16Gi  spot=no  max=4  enabled  "
                                 "pending=1 active=1 inactive=1")
    assert "machine per job" in lines["pools"][2]
    assert [line.split()[0] for line in lines["instances --pool standard"]] == ["i1", "i3", "i4"]
    i1 = lines["instances --state active"][0]
    assert i1.startswith("i1  standard  active  cores=4 free=") and "running=1  heartbeat=2023-" in i1
    assert lines["instances --pool standard"][1].startswith("i3  standard  pending  cores=2 free=2  running=0  "
                                                            "heartbeat=-  created=2023-")
    assert lines["instances --pool standard"][2].startswith("i4  standard  inactive  cores=2 free=-  running=0")


async def test_a_paused_pool_starts_nothing_until_resumed(env: Env, auth_app: AuthApp, certs: DevCertificateAuthority,
                                                          tmp_path: Path) -> None:
    """PausePool and ResumePool each way (administrators only), what they change for the scheduler (its workers'
    read leaves the pool out; the autoscaler's pools too) and ExplainJob (POOL_PAUSED), and `corral pools`."""
    from corral.batch.v1 import job_explanation_pb2
    from corral.batch.v1 import job_service_pb2 as jpb
    from services.db.plan_snapshot import read_workers
    from services.driver.store import DriverStore

    w = env.world
    await w.instance("i1", 4000)
    batch_id = await env.submit(spec())
    root = env.as_("root")
    async with person_channel(certs.issue("someone"), env.frontend.public_port) as channel:
        fleet = fleet_service_pb2_grpc.FleetServiceStub(channel)
        paused = (await fleet.PausePool(pb.PausePoolRequest(pool="standard"), metadata=root)).pool
        assert (paused.name, paused.paused, paused.paused_by) == ("standard", True, "root")
        first_at = paused.paused_at.ToMilliseconds()
        again = (await fleet.PausePool(pb.PausePoolRequest(pool="standard"), metadata=root)).pool
        assert again.paused and again.paused_at.ToMilliseconds() == first_at  # the first pause is kept
        assert "standard" not in await read_workers(w.db)  # the scheduler places nothing there
        assert "standard" not in {p.name for p in await DriverStore(w.db).pools()}  # nor makes machines
        [reason] = (await env.jobs.ExplainJob(jpb.ExplainJobRequest(batch_id=batch_id, job_id=1),
                                              metadata=env.as_("alice"))).explanation.reasons
        assert reason.code == job_explanation_pb2.WAIT_REASON_CODE_POOL_PAUSED
        assert reason.detail.startswith("pool standard was paused by root")
        for who in ("alice", "bob"):
            assert (await refused(fleet.PausePool(pb.PausePoolRequest(pool="highmem"), metadata=env.as_(who)))
                    ).code() == grpc.StatusCode.PERMISSION_DENIED
        for call in (fleet.PausePool(pb.PausePoolRequest(pool="nope"), metadata=root),
                     fleet.PausePool(pb.PausePoolRequest(pool="job-private"), metadata=root)):
            assert (await refused(call)).code() == grpc.StatusCode.NOT_FOUND
        resumed = (await fleet.ResumePool(pb.ResumePoolRequest(pool="standard"), metadata=root)).pool
        assert (resumed.paused, resumed.paused_by, resumed.HasField("paused_at")) == (False, "", False)
        assert not (await fleet.ResumePool(pb.ResumePoolRequest(pool="standard"), metadata=root)).pool.paused
        assert [x.name for x in (await read_workers(w.db))["standard"]] == ["i1"]
        answer = await env.jobs.ExplainJob(jpb.ExplainJobRequest(batch_id=batch_id, job_id=1), metadata=env.as_("alice"))
        assert list(answer.explanation.reasons) == []  # room, nothing in the way
    # The CLI, as an administrator.
    cli = await logged_in("admin", env.frontend.public_port, auth_app, certs, tmp_path, admin=True)
    paused_line = await corral(cli, "pools", "pause", "highmem")
    assert paused_line.returncode == 0 and paused_line.stdout.startswith("highmem  local") and \
        "paused by admin at " in paused_line.stdout, paused_line.stderr
    listed = await corral(cli, "pools", "ls")
    assert [line.split()[0] for line in listed.stdout.splitlines() if "paused by" in line] == ["highmem"]
    resumed_line = await corral(cli, "pools", "resume", "highmem")
    assert resumed_line.returncode == 0 and "paused" not in resumed_line.stdout
