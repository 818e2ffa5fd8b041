"""The Python client (sync and asyncio) against a real frontend and auth."""

from __future__ import annotations

import asyncio

import pytest

import corral
from corral import aio
from services.common.tls import DevCertificateAuthority
from services.frontend.app import FrontendApp
from tests.service.test_batches import tokens  # noqa: F401 - fixture


def dag(n_fan_out: int, billing_project: str = "proj", token: str | None = None) -> corral.BatchBuilder:
    b = corral.BatchBuilder(billing_project, attributes={"name": "fan"}, idempotency_token=token)
    root = b.job("busybox", ["echo", "start"])
    middle = [b.job("busybox", "echo $RANDOM", parents=[root]) for _ in range(n_fan_out)]
    b.job("busybox", ["echo", "done"], parents=middle, accept=("succeeded", "failed"), always_run=True)
    return b


async def test_async_client_small_and_large_submissions(frontend: FrontendApp, tokens,  # noqa: F811
                                                        certs: DevCertificateAuthority) -> None:
    async with aio.Client(f"localhost:{frontend.public_port}", tokens["alice"], certs.ca_cert_path) as client:
        small = await client.submit(dag(3))
        assert (small.counts.n_jobs, small.counts.n_ready) == (5, 1)
        # Large: more than one SubmitBatch's worth, in parallel bunches.
        large = await client.submit(dag(aio.SMALL_BATCH + 500), bunch_size=400)
        assert (large.counts.n_jobs, large.counts.n_ready) == (aio.SMALL_BATCH + 502, 1)
        edges = await frontend.db.fetchone(
            "SELECT COUNT(*) n FROM job_parents WHERE batch_id = %s", (large.batch_id,))
        assert edges["n"] == 2 * (aio.SMALL_BATCH + 500)
        names = [b.batch_id async for b in client.list_batches("name=fan")]
        assert names == [large.batch_id, small.batch_id]
        cancelled = await client.cancel_batch(small.batch_id, "test")
        assert cancelled.cancellation.reason == "test"


async def test_retried_submission_is_one_batch(frontend: FrontendApp, tokens,  # noqa: F811
                                               certs: DevCertificateAuthority) -> None:
    builder = dag(aio.SMALL_BATCH + 10, token="same-token")
    async with aio.Client(f"localhost:{frontend.public_port}", tokens["alice"], certs.ca_cert_path) as client:
        first, second = await asyncio.gather(client.submit(builder, bunch_size=300),
                                             client.submit(builder, bunch_size=300))
    assert first.batch_id == second.batch_id
    count = await frontend.db.fetchone("SELECT COUNT(*) n FROM jobs")
    assert count["n"] == aio.SMALL_BATCH + 12


async def test_sync_client_and_typed_errors(frontend: FrontendApp, tokens,  # noqa: F811
                                            certs: DevCertificateAuthority) -> None:
    address = f"localhost:{frontend.public_port}"

    def use_it() -> None:
        with corral.Client(address, tokens["alice"], certs.ca_cert_path) as client:
            batch = client.submit(dag(2))
            assert client.get_batch(batch.batch_id).counts.n_jobs == 4
            assert [b.batch_id for b in client.list_batches()] == [batch.batch_id]
            bad = corral.BatchBuilder("proj")
            bad.job("", ["true"])
            with pytest.raises(corral.InvalidArgument) as error:
                client.submit(bad)
            assert [v.field for v in error.value.field_violations] == ["jobs[0].image"]
            with pytest.raises(corral.NotFound):
                client.get_batch(10_000)
        with corral.Client(address, tokens["bob"], certs.ca_cert_path) as client:
            with pytest.raises(corral.NotFound):  # bob is outside proj: to him it does not exist
                client.submit(dag(1))
        with corral.Client(address, "wrong", certs.ca_cert_path) as client:
            with pytest.raises(corral.Unauthenticated):
                client.get_batch(1)

    await asyncio.to_thread(use_it)


async def test_a_refused_bunch_leaves_no_batch(frontend: FrontendApp, tokens,  # noqa: F811
                                               certs: DevCertificateAuthority) -> None:
    """Issue 12, nothing half-written, the bunch path: CreateBatch cannot see the jobs, so a bad job is
    refused in its bunch, after the batch exists; the client then deletes the batch it made."""
    def bad_large() -> corral.BatchBuilder:
        b = dag(aio.SMALL_BATCH + 10)
        b.job("", ["true"])  # no image: refused in the last bunch
        return b

    address = f"localhost:{frontend.public_port}"
    async with aio.Client(address, tokens["alice"], certs.ca_cert_path) as client:
        kept = await client.submit(dag(1))
        builder = bad_large()
        token = builder.idempotency_token
        with pytest.raises(corral.InvalidArgument) as error:
            await client.submit(builder, bunch_size=400)
        assert [v.field for v in error.value.field_violations] == ["jobs[212].image"]
        assert [b.batch_id async for b in client.list_batches()] == [kept.batch_id]
        assert builder.idempotency_token != token  # submitting it again starts afresh
    left_open = await frontend.db.fetchone("SELECT COUNT(*) n FROM batches WHERE NOT deleted AND state = 'open'")
    assert left_open["n"] == 0

    def sync_client() -> None:
        with corral.Client(address, tokens["alice"], certs.ca_cert_path) as client:
            with pytest.raises(corral.InvalidArgument):
                client.submit(bad_large(), bunch_size=400)
            assert [b.batch_id for b in client.list_batches()] == [kept.batch_id]

    await asyncio.to_thread(sync_client)


async def test_update_adds_jobs_to_a_batch_and_big_specs_go_in_bunches(frontend: FrontendApp, tokens,  # noqa: F811
                                                                       certs: DevCertificateAuthority) -> None:
    """Issue 37: `update` adds a builder's jobs to an existing batch, its int parents the batch's job ids; and
    specs larger than one request (here 22 x 200 KiB of script, more than the 4 MiB a frontend receives; a spec holds at
    most 256 KiB) go up in bunches, small as the batch is."""
    async with aio.Client(f"localhost:{frontend.public_port}", tokens["alice"], certs.ca_cert_path) as client:
        first = await client.submit(dag(1))
        more = corral.BatchBuilder("proj")
        child = more.job("busybox", ["echo", "after"], parents=[3])
        more.job("busybox", ["echo", "last"], parents=[child])
        committed = await client.update(first.batch_id, more)
        assert committed.update.start_job_id == 4 and committed.batch.counts.n_jobs == 5
        parents = await frontend.db.fetchall(
            "SELECT job_id, parent_id FROM job_parents WHERE batch_id = %s AND job_id > 3 ORDER BY job_id",
            (first.batch_id,))
        assert [(p["job_id"], p["parent_id"]) for p in parents] == [(4, 3), (5, 4)]
        big = corral.BatchBuilder("proj")
        for i in range(22):
            big.job("busybox", f"echo {i} {'x' * 200 * 1024}")
        assert big.spec_bytes() > 4 * 2**20 and len(big.bunches(aio.BUNCH_SIZE, aio.BUNCH_BYTES)) == 3
        submitted = await client.submit(big)
        assert submitted.counts.n_jobs == 22
