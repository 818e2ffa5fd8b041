"""The query language fuzzed through the real ListBatches and ListJobs over
gRPC, on a real frontend and MariaDB: generated queries (tests/fuzz/
query_inputs.py) are answered, or refused with INVALID_ARGUMENT on `query`
whose description gives a position inside the query, exactly when the
parser in process refuses them; never INTERNAL, never UNKNOWN. So every
query the parser lets through compiles to SQL MariaDB runs.
"""

from __future__ import annotations

import re

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from hypothesis import strategies as st

from corral.batch.v1 import batch_service_pb2 as bpb
from corral.batch.v1 import job_service_pb2 as jpb
from tests.fuzz.drawing import draw_examples
from tests.fuzz.query_inputs import GRAMMATICAL, check_query, query_texts
from tests.service.test_jobs import Env, env, spec  # noqa: F401 - env is a fixture

EXAMPLES_PER_KIND = 120
POSITION = re.compile(r"^at character (\d+): ")


def query_violation(error: grpc.aio.AioRpcError) -> str:
    """The description of the one BadRequest violation, which must name `query`."""
    status = rpc_status.from_call(error)
    assert status is not None and len(status.details) == 1
    bad = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(bad)
    assert [v.field for v in bad.field_violations] == ["query"]
    return bad.field_violations[0].description


def expect_answer_or_refusal(text: str, kind: str, error: grpc.aio.AioRpcError | None) -> None:
    """What the frontend said is what the parser in process says: answered, or refused at a
    position within the text."""
    where = f"{kind} query {text!r}"
    refused = check_query(text, kind).refusal  # type: ignore[arg-type]
    if error is None:
        assert refused is None, f"{where}: answered, but the parser refuses it ({refused})"
        return
    if error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_statement_time_s" in (error.details() or ""):
        return  # the statement time limit, a limit of its own (docs/security.md), not an internal error
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, f"{where}: {error.code().name} {error.details()}"
    assert refused is not None, f"{where}: refused ({error.details()}), but the parser accepts it"
    found = POSITION.match(query_violation(error))
    assert found, f"{where}: no position in {query_violation(error)!r}"
    assert int(found.group(1)) == refused.position <= len(text), where


async def test_generated_queries_are_answered_or_refused_with_a_position(env: Env) -> None:
    alice = env.as_("alice")
    batch_id = await env.submit(spec(name="align"), spec(-1, name="call"))
    await env.world.store.create_batch("alice", "proj", attributes={"name": "x", "sample": "é"})
    for kind in ("batches", "jobs"):
        # Grammatical queries twice over: they are the ones that reach the database.
        generated = st.one_of(query_texts(kind), GRAMMATICAL[kind])  # type: ignore[arg-type]
        texts = draw_examples(generated, EXAMPLES_PER_KIND)
        assert len(texts) > EXAMPLES_PER_KIND // 2
        for text in texts:
            try:
                if kind == "batches":
                    await env.batches.ListBatches(bpb.ListBatchesRequest(query=text), metadata=alice)
                else:
                    await env.jobs.ListJobs(jpb.ListJobsRequest(batch_id=batch_id, query=text), metadata=alice)
            except grpc.aio.AioRpcError as error:
                expect_answer_or_refusal(text, kind, error)
            else:
                expect_answer_or_refusal(text, kind, None)


async def test_what_the_fuzzer_found_is_refused_over_grpc(env: Env) -> None:
    """The first four were INTERNAL: an OverflowError in the parser, or `inf` in the SQL. The
    last was refused by the request interceptor's length check, without a position."""
    alice = env.as_("alice")
    batch_id = await env.submit(spec())
    for text in ("duration>" + "9" * 400, "cost>1e999", "cost<-1e999", "start_time>0001-01-01T00:00+23:59",
                 "(" * 5_000):
        for kind in ("batches", "jobs"):
            try:
                if kind == "batches":
                    await env.batches.ListBatches(bpb.ListBatchesRequest(query=text), metadata=alice)
                else:
                    await env.jobs.ListJobs(jpb.ListJobsRequest(batch_id=batch_id, query=text), metadata=alice)
            except grpc.aio.AioRpcError as error:
                assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (text, error.details())
                assert POSITION.match(query_violation(error)), text
            else:
                raise AssertionError(f"{text!r} was answered")
