"""Quotas over real gRPC: SetQuota (administrators only, every value checked, NOT_FOUND for no such project or
user), ListQuotas (administrators see every quota, others their projects' and their own, in pages), the
ready-jobs cap refusing a submission with RESOURCE_EXHAUSTED, ExplainJob naming a running-cores quota
(QUOTA_REACHED), and `corral quotas set|ls` as a real subprocess."""

from __future__ import annotations

from pathlib import Path

import grpc

from corral.batch.v1 import job_explanation_pb2
from corral.batch.v1 import job_service_pb2 as jpb
from corral.billing.v1 import billing_service_pb2 as pb
from corral.billing.v1 import billing_service_pb2_grpc, quota_pb2
from services.auth.app import AuthApp
from services.common.tls import DevCertificateAuthority
from tests.service.conftest import person_channel
from tests.service.test_cli import corral, logged_in
from tests.service.test_jobs import Env, env, refused, spec, violations  # noqa: F401 - env is a fixture

PROJECT, USER = quota_pb2.QUOTA_KIND_PROJECT, quota_pb2.QUOTA_KIND_USER


async def test_set_and_list_quotas_by_who_may(env: Env, certs: DevCertificateAuthority) -> None:
    root = env.as_("root")
    async with person_channel(certs.issue("someone"), env.frontend.public_port) as channel:
        billing = billing_service_pb2_grpc.BillingServiceStub(channel)
        got = (await billing.SetQuota(pb.SetQuotaRequest(kind=PROJECT, name="proj", max_running_cores_mcpu=4000,
                                                         max_running_jobs=10, weight=2), metadata=root)).quota
        assert (got.kind, got.name, got.max_running_cores_mcpu, got.max_running_jobs, got.HasField("max_ready_jobs"),
                got.weight, got.set_by) == (PROJECT, "proj", 4000, 10, False, 2, "root")
        assert got.set_at.ToMilliseconds() > 0
        for kind, name in ((PROJECT, "elsewhere"), (USER, "alice"), (USER, "carol")):
            await billing.SetQuota(pb.SetQuotaRequest(kind=kind, name=name, max_ready_jobs=100), metadata=root)

        async def listed(who: str, **request) -> list[str]:
            answer = await billing.ListQuotas(pb.ListQuotasRequest(**request), metadata=env.as_(who))
            return [f"{'project' if q.kind == PROJECT else 'user'}/{q.name}" for q in answer.quotas]
        assert await listed("root") == ["project/elsewhere", "project/proj", "user/alice", "user/carol"]
        assert await listed("alice") == ["project/proj", "user/alice"]  # her project's and her own
        assert await listed("bob") == ["project/proj"]
        assert await listed("carol") == ["project/elsewhere", "user/carol"]
        assert await listed("root", kind=USER) == ["user/alice", "user/carol"]
        first = await billing.ListQuotas(pb.ListQuotasRequest(page_size=3), metadata=root)
        assert first.next_page_token
        rest = await billing.ListQuotas(pb.ListQuotasRequest(page_token=first.next_page_token), metadata=root)
        assert [q.name for q in (*first.quotas, *rest.quotas)] == ["elsewhere", "proj", "alice", "carol"]
        assert (await refused(billing.ListQuotas(pb.ListQuotasRequest(page_token="bogus"), metadata=root))
                ).code() == grpc.StatusCode.INVALID_ARGUMENT

        # Cleared by the default; administrators only; every value checked at once; NOT_FOUND for no such name.
        cleared = (await billing.SetQuota(pb.SetQuotaRequest(kind=USER, name="carol"), metadata=root)).quota
        assert (cleared.weight, cleared.set_by, cleared.HasField("max_ready_jobs")) == (1, "", False)
        for who in ("alice", "bob", "carol"):
            assert (await refused(billing.SetQuota(pb.SetQuotaRequest(kind=PROJECT, name="proj", weight=5),
                                                   metadata=env.as_(who)))).code() == grpc.StatusCode.PERMISSION_DENIED
        error = await refused(billing.SetQuota(pb.SetQuotaRequest(
            max_running_cores_mcpu=0, max_running_jobs=-1, max_ready_jobs=1_000_000_001, weight=1001), metadata=root))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert violations(error) == ["kind", "name", "max_running_cores_mcpu", "max_running_jobs", "max_ready_jobs",
                                     "weight"]
        for kind, name, words in ((PROJECT, "nope", "no billing project nope"), (USER, "mallory", "no user mallory")):
            error = await refused(billing.SetQuota(pb.SetQuotaRequest(kind=kind, name=name, weight=2), metadata=root))
            assert (error.code(), error.details()) == (grpc.StatusCode.NOT_FOUND, words)
        assert await listed("root") == ["project/elsewhere", "project/proj", "user/alice"]


async def test_quotas_hold_submissions_and_explain_their_waits(env: Env, certs: DevCertificateAuthority) -> None:
    root = env.as_("root")
    await env.world.instance("i1", 8000)
    async with person_channel(certs.issue("someone"), env.frontend.public_port) as channel:
        billing = billing_service_pb2_grpc.BillingServiceStub(channel)
        await billing.SetQuota(pb.SetQuotaRequest(kind=USER, name="alice", max_ready_jobs=3), metadata=root)
        error = await refused(env.submit(spec(), spec(), spec(), spec()))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "would pass the quota (max_ready_jobs) of user alice: 3" in error.details()
        batch_id = await env.submit(spec(), spec())
        running = await env.world.run(batch_id, 1, "i1")
        assert running
        await billing.SetQuota(pb.SetQuotaRequest(kind=PROJECT, name="proj", max_running_cores_mcpu=1000),
                               metadata=root)
        explained = (await env.jobs.ExplainJob(jpb.ExplainJobRequest(batch_id=batch_id, job_id=2),
                                               metadata=env.as_("alice"))).explanation
        [reason] = explained.reasons
        assert reason.code == job_explanation_pb2.WAIT_REASON_CODE_QUOTA_REACHED
        assert reason.detail == ("the quota of billing project proj (set by root) caps its running cores at 1: it "
                                 "runs 1 across every pool, 0 start this cycle, and the job needs 1")


async def test_corral_quotas_set_and_ls(env: Env, auth_app: AuthApp, certs: DevCertificateAuthority,
                                        tmp_path: Path) -> None:
    cli = await logged_in("admin", env.frontend.public_port, auth_app, certs, tmp_path, admin=True)
    first = await corral(cli, "quotas", "set", "proj", "--running-cores", "4", "--running-jobs", "8", "--weight", "2")
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("project proj  running_cores=4  running_jobs=8  ready_jobs=none  weight=2  "
                                   "set by admin at "), first.stdout
    # Options not given keep their value; `none` clears a cap.
    second = await corral(cli, "quotas", "set", "proj", "--running-jobs", "none", "--ready-jobs", "50")
    assert second.stdout.startswith("project proj  running_cores=4  running_jobs=none  ready_jobs=50  weight=2"), \
        second.stdout + second.stderr
    user = await corral(cli, "quotas", "set", "--user", "bob", "--running-cores", "500m")
    assert user.stdout.startswith("user bob  running_cores=500m  running_jobs=none  ready_jobs=none  weight=1")
    listed = await corral(cli, "quotas", "ls")
    assert [line.split("  ")[0] for line in listed.stdout.splitlines()] == ["project proj", "user bob"]
    both = await corral(cli, "quotas", "set", "proj", "--user", "bob", "--weight", "3")
    assert both.returncode != 0 and "not both" in both.stderr
    bad = await corral(cli, "quotas", "set", "proj", "--weight", "0")
    assert bad.returncode != 0 and "--weight" in bad.stderr, bad.stderr
    cleared = await corral(cli, "quotas", "set", "--user", "bob", "--running-cores", "none")
    assert cleared.stdout.startswith("user bob  running_cores=none  running_jobs=none  ready_jobs=none  weight=1")
    assert "set by" not in cleared.stdout
