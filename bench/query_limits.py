"""query-limits: what the queries of issue 9's attacker cost now.

A 60,000-word ListBatches query once ran past its deadline until MariaDB
was OOM-killed at 21 GB, and a 3.8 MB one ran 56 s. Auth and a frontend run
as their own processes with their default limits (services/frontend/limits.py;
each user's share lifted, bench/stack.py) on a fresh schema holding N batches
with attributes and one batch of jobs;
each query below goes to ListBatches and ListJobs over gRPC, and the
benchmark prints how long the answer took and MariaDB's resident memory
(from /proc, by the server's pid file) before and after.

The attacks are refused by the parser (INVALID_ARGUMENT); the largest legal
queries (at max_query_bytes and max_query_terms) are answered, or stopped
by the statement time limit (RESOURCE_EXHAUSTED). The outcome of each is
in the JSON's parameters.

Then the largest page each list gives (1,000 batches of ListBatches, 1,000
jobs of ListJobs, no query), read PAGE_READS times: the p50 of each is
what a person paging through their batches waits per page.
"""

from __future__ import annotations

import argparse
import time
import uuid
from typing import Any

import grpc

from bench.common import BenchContext, fresh_database, percentile, positive_int, progress
from bench.stack import frontend_stack, work_dir
from corral.aio import channel_credentials
from corral.batch.v1 import batch_service_pb2 as bpb
from corral.batch.v1 import batch_service_pb2_grpc, job_service_pb2_grpc, job_spec_pb2
from corral.batch.v1 import job_service_pb2 as jpb
from services.db.database import Database
from services.db.server import server_rss_bytes
from services.db.store import JobStore
from services.frontend.limits import Limits

NAME = "query-limits"
HELP = "the 60,000-word, 1 MB and nested-parentheses queries, and the largest legal ones: time and MariaDB memory"

DEFAULT_BATCHES = 2_000
PAGE = 1_000
"""The largest page ListBatches and ListJobs give (MAX_PAGE_SIZE)."""
PAGE_READS = 7
SMOKE_BATCHES = 50
JOBS = 1_000
SMOKE_JOBS = 50

_LIMITS = Limits()
_WORD = "w" * (_LIMITS.max_query_bytes // _LIMITS.max_query_terms - 1)
QUERIES = {
    # issue 9's attacks
    "words_60000": " ".join(f"word{i}" for i in range(60_000)),
    "bytes_1mb": "x" * (1 << 20),
    "parens_10000": "(" * 10_000 + "x" + ")" * 10_000,
    # the largest queries the default limits let through: every term a scan of the attributes
    "legal_longest_words": " ".join([_WORD] * _LIMITS.max_query_terms),
    "legal_most_terms": " ".join(["cost>0"] * _LIMITS.max_query_terms),
    # every batch passes all terms but the last: each row costs every subquery
    "legal_costliest": " ".join(["bench-query"] * (_LIMITS.max_query_terms - 1) + ["nowhere"]),
}
"""What each case sends as the query."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batches", type=positive_int, metavar="N",
                        help=f"batches with attributes to search (default {DEFAULT_BATCHES:,}; "
                             f"{SMOKE_BATCHES} with --smoke)")


def figure_names() -> list[str]:
    """Every figure a run prints, in order."""
    names = [f"{NAME}.{rpc}.{case}.ms" for case in QUERIES for rpc in ("list_batches", "list_jobs")]
    pages = [f"{NAME}.{rpc}.page_{PAGE}.ms" for rpc in ("list_batches", "list_jobs")]
    return [f"{NAME}.mariadb_rss_before", *names, f"{NAME}.mariadb_rss_after", f"{NAME}.mariadb_rss_growth",
            *pages]


async def populate(db: Database, billing_project: str, user: str, n_batches: int) -> None:
    store = JobStore(db)
    for i in range(n_batches):
        await store.create_batch(user, billing_project, attributes={
            "name": f"bench-query-{i}", "sample": f"S{i:06d}", "pipeline": "align" if i % 2 else "call"})


async def run(ctx: BenchContext, args: argparse.Namespace) -> dict[str, Any]:
    n_batches = args.batches or (SMOKE_BATCHES if ctx.smoke else DEFAULT_BATCHES)
    n_jobs = SMOKE_JOBS if ctx.smoke else JOBS
    outcomes: dict[str, str] = {}
    with work_dir() as root:
        async with fresh_database(ctx.server, pool_size=4) as db, frontend_stack(db, root) as stack:
            progress(f"{NAME}: {n_batches:,} batches with attributes, one of {n_jobs:,} jobs")
            await populate(db, stack.billing_project, stack.user, n_batches)
            metadata = (("authorization", f"Bearer {stack.token}"),)
            credentials = channel_credentials(stack.ca_cert)
            async with grpc.aio.secure_channel(stack.frontend_address, credentials) as channel:
                batches = batch_service_pb2_grpc.BatchServiceStub(channel)
                jobs = job_service_pb2_grpc.JobServiceStub(channel)
                spec = job_spec_pb2.JobSpec(image="busybox", argv=job_spec_pb2.Argv(args=["true"]),
                                            attributes={"name": "bench-query-job"})
                submitted = await batches.SubmitBatch(bpb.SubmitBatchRequest(
                    idempotency_token=uuid.uuid4().hex,
                    billing_project=stack.billing_project, jobs=[spec] * n_jobs), metadata=metadata)
                batch_id = submitted.batch.batch_id
                rss_before = server_rss_bytes(db.config)
                ctx.figures.add(f"{NAME}.mariadb_rss_before", _mib(rss_before), "MiB")
                for case, text in QUERIES.items():
                    calls = {"list_batches": lambda q: batches.ListBatches(bpb.ListBatchesRequest(query=q),
                                                                           metadata=metadata),
                             "list_jobs": lambda q: jobs.ListJobs(jpb.ListJobsRequest(batch_id=batch_id, query=q),
                                                                  metadata=metadata)}
                    for rpc, call in calls.items():
                        started = time.perf_counter()
                        try:
                            await call(text)
                            outcome = "OK"
                        except grpc.aio.AioRpcError as e:
                            outcome = e.code().name
                        elapsed_ms = (time.perf_counter() - started) * 1000
                        outcomes[f"{rpc}.{case}"] = outcome
                        progress(f"{NAME}: {rpc} {case} ({len(text.encode()):,} bytes): {outcome}")
                        ctx.figures.add(f"{NAME}.{rpc}.{case}.ms", round(elapsed_ms, 1), "ms")
                rss_after = server_rss_bytes(db.config)
                ctx.figures.add(f"{NAME}.mariadb_rss_after", _mib(rss_after), "MiB")
                growth = None if rss_before is None or rss_after is None else rss_after - rss_before
                ctx.figures.add(f"{NAME}.mariadb_rss_growth", _mib(growth), "MiB")
                pages = {"list_batches": lambda: batches.ListBatches(bpb.ListBatchesRequest(page_size=PAGE),
                                                                     metadata=metadata),
                         "list_jobs": lambda: jobs.ListJobs(jpb.ListJobsRequest(batch_id=batch_id, page_size=PAGE),
                                                            metadata=metadata)}
                for rpc, read in pages.items():
                    took = []
                    for _ in range(PAGE_READS):
                        started = time.perf_counter()
                        await read()
                        took.append((time.perf_counter() - started) * 1000)
                    ctx.figures.add(f"{NAME}.{rpc}.page_{PAGE}.ms", round(percentile(took, 50), 1), "ms")
    return {"smoke": ctx.smoke, "n_batches": n_batches, "n_jobs": n_jobs, "outcomes": outcomes,
            "query_bytes": {case: len(text.encode()) for case, text in QUERIES.items()},
            "limits": {"max_query_bytes": _LIMITS.max_query_bytes, "max_query_terms": _LIMITS.max_query_terms,
                       "max_statement_time_s": _LIMITS.max_statement_time_s}}


def _mib(n_bytes: int | None) -> float:
    """MiB, one decimal; -1 when the server's memory cannot be read (a remote server)."""
    return -1 if n_bytes is None else round(n_bytes / (1 << 20), 1)
