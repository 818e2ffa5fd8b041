"""Issue 9, acceptance 2: the 60,000-word query, a 1 MB query and 10,000
nested parentheses are refused (or answered within the statement limit),
and MariaDB's memory stays bounded, over real gRPC against a real frontend.

MariaDB's resident memory is read from /proc by its pid file before and
after; the figures (times included) come from `python -m bench query-limits`
(docs/performance.md). The same queries are used here.
"""

from __future__ import annotations

import grpc
import pytest

from bench.query_limits import QUERIES
from corral.batch.v1 import batch_service_pb2 as bpb
from corral.batch.v1 import job_service_pb2 as jpb
from services.db.server import server_rss_bytes
from tests.service.test_jobs import Env, env, refused, spec, violations  # noqa: F401 - env is a fixture

ATTACKS = ("words_60000", "bytes_1mb", "parens_10000")
MAX_GROWTH_BYTES = 200 << 20


async def test_the_attack_queries_are_refused_and_mariadb_memory_stays_bounded(env: Env) -> None:
    alice = env.as_("alice")
    for i in range(100):
        await env.world.store.create_batch("alice", "proj", attributes={"name": f"batch-{i}", "sample": f"S{i}"})
    batch_id = await env.submit(*[spec(name=f"job-{i}") for i in range(100)])
    before = server_rss_bytes(env.world.db.config)
    if before is None:
        pytest.skip("the database server's memory cannot be read from here")

    for case in ATTACKS:
        calls = [env.batches.ListBatches(bpb.ListBatchesRequest(query=QUERIES[case]), metadata=alice),
                 env.jobs.ListJobs(jpb.ListJobsRequest(batch_id=batch_id, query=QUERIES[case]), metadata=alice),
                 env.batches.WatchBatch(bpb.WatchBatchRequest(batch_id=batch_id, query=QUERIES[case]),
                                        metadata=alice).read()]
        for call in calls:
            error = await refused(call)
            assert (error.code(), violations(error)) == (grpc.StatusCode.INVALID_ARGUMENT, ["query"]), case
    # The largest queries the limits let through are answered, or stopped by the statement limit.
    for case in sorted(set(QUERIES) - set(ATTACKS)):
        for call in (env.batches.ListBatches(bpb.ListBatchesRequest(query=QUERIES[case]), metadata=alice),
                     env.jobs.ListJobs(jpb.ListJobsRequest(batch_id=batch_id, query=QUERIES[case]), metadata=alice)):
            try:
                await call
            except grpc.aio.AioRpcError as e:
                assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, case

    after = server_rss_bytes(env.world.db.config)
    assert after is not None
    assert after - before < MAX_GROWTH_BYTES, f"MariaDB grew by {(after - before) >> 20} MiB"
