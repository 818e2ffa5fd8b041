"""fuzz-query: the query language fuzzed with a million generated inputs.

In process, hypothesis generates (kind, query, seed) examples from
tests/fuzz/query_inputs.py (grammatical queries, mutants, garbage); each
example's query, and `--mutants` mutants of it made from its seed, go
through the parser and the SQL compiler as the frontend runs them, and
`check_query` holds each to the property: nothing raised but the
parser's own QuerySyntaxError, with a position inside the input; every
parsed query compiles to SQL whose parameters MariaDB takes, and formats
back to itself. Then auth and a frontend start as processes on a fresh
schema, and a sample of the inputs (half parsed, half refused) goes to
ListBatches or ListJobs over gRPC: each must be answered, or refused with
INVALID_ARGUMENT on `query` at the position the parser gives (a read
stopped by the statement time limit is counted apart).

Prints inputs, inputs/s, parsed, refused, internal errors (an exception
other than the parser's own: INTERNAL over gRPC) and property failures
(a refusal without its position, a parameter MariaDB cannot take), in
process and over gRPC; the first failures are in the JSON, and on stderr.
This is a check as much as a figure: any failure is a bug.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import re
import time
import traceback
import uuid
from typing import Any

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from bench.common import BenchContext, fresh_database, positive_int, progress
from bench.stack import frontend_stack, work_dir
from corral.aio import channel_credentials
from corral.batch.v1 import batch_service_pb2 as bpb
from corral.batch.v1 import batch_service_pb2_grpc, job_service_pb2_grpc, job_spec_pb2
from corral.batch.v1 import job_service_pb2 as jpb
from services.db.store import JobStore
from tests.fuzz.query_inputs import KINDS, QUERY_TEXTS, check_query, mutants

NAME = "fuzz-query"
HELP = "the query language fuzzed: a million generated inputs in process, a sample over gRPC; internal errors"

DEFAULT_INPUTS = 1_000_000
SMOKE_INPUTS = 2_000
DEFAULT_MUTANTS = 50
DEFAULT_GRPC_SAMPLE = 2_000
SMOKE_GRPC_SAMPLE = 40
CONCURRENT_CALLS = 8
KEPT_ERRORS = 20
"""Internal errors kept whole for the JSON (all are counted)."""
_POSITION = re.compile(r"^at character (\d+): ")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--inputs", type=positive_int, metavar="N",
                        help=f"inputs through the parser and compiler (default {DEFAULT_INPUTS:,}; "
                             f"{SMOKE_INPUTS:,} with --smoke)")
    parser.add_argument("--mutants", type=int, default=DEFAULT_MUTANTS, metavar="M",
                        help=f"mutants made from each hypothesis example's seed (default {DEFAULT_MUTANTS}); "
                             "0: every input straight from hypothesis (far slower: some hundreds a second here)")
    parser.add_argument("--grpc-sample", type=int, metavar="N",
                        help=f"inputs sent over gRPC (default {DEFAULT_GRPC_SAMPLE:,}; "
                             f"{SMOKE_GRPC_SAMPLE} with --smoke)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the gRPC sample's choice (default 0)")


def figure_names() -> list[str]:
    """Every figure a run prints, in order."""
    return [f"{NAME}.{name}" for name in (
        "inputs", "inputs_per_s", "parsed", "refused", "internal_errors", "property_failures",
        "grpc.calls", "grpc.answered", "grpc.refused", "grpc.statement_limit", "grpc.internal_errors",
        "grpc.wrong_answers")]


class Sample:
    """Two reservoirs, of parsed and of refused inputs, `size` // 2 each."""

    def __init__(self, size: int, seed: int):
        self._size = size // 2
        self._rng = random.Random(seed)
        self._seen = {True: 0, False: 0}
        self.kept: dict[bool, list[tuple[str, str]]] = {True: [], False: []}

    def offer(self, parsed: bool, kind: str, text: str) -> None:
        self._seen[parsed] += 1
        kept = self.kept[parsed]
        if len(kept) < self._size:
            kept.append((kind, text))
        elif (i := self._rng.randrange(self._seen[parsed])) < self._size:
            kept[i] = (kind, text)


class InProcess:
    """Counts of the in-process run and the failures it met."""

    def __init__(self, sample: Sample):
        self.inputs = self.parsed = self.refused = self.internal = self.property_failures = 0
        self.errors: list[dict[str, str]] = []
        self.sample = sample

    def check(self, kind: str, text: str) -> None:
        self.inputs += 1
        try:
            parsed = check_query(text, kind).query is not None  # type: ignore[arg-type]
        except Exception as error:  # noqa: BLE001 - every failure is counted and kept, not raised
            # An AssertionError is check_query's: the parser or compiler answered, wrongly
            # (a position outside the text, a parameter MariaDB cannot take). Anything
            # else escaped them: over gRPC, an INTERNAL.
            if isinstance(error, AssertionError):
                self.property_failures += 1
            else:
                self.internal += 1
            if len(self.errors) < KEPT_ERRORS:
                self.errors.append({"kind": kind, "text": text, "error": "".join(
                    traceback.format_exception_only(type(error), error)).strip()})
            return
        if parsed:
            self.parsed += 1
        else:
            self.refused += 1
        self.sample.offer(parsed, kind, text)


def fuzz_in_process(n_inputs: int, n_mutants: int, counts: InProcess) -> None:
    """Hypothesis examples and their mutants until `n_inputs` inputs were checked."""
    per_example = 1 + n_mutants
    examples = st.tuples(st.sampled_from(KINDS).flatmap(lambda kind: st.tuples(st.just(kind), QUERY_TEXTS[kind])),
                         st.integers(min_value=0, max_value=2**32 - 1))

    @settings(max_examples=math.ceil(n_inputs / per_example) + 10, database=None, phases=[Phase.generate],
              deadline=None, suppress_health_check=list(HealthCheck))
    @given(examples)
    def run(example: tuple[tuple[str, str], int]) -> None:
        (kind, text), seed = example
        if counts.inputs >= n_inputs:
            return
        counts.check(kind, text)
        for mutant in mutants(text, seed, min(n_mutants, n_inputs - counts.inputs)):
            counts.check(kind, mutant)
        if counts.inputs >= next_report[0]:
            progress(f"{NAME}: {counts.inputs:,} inputs, {counts.internal + counts.property_failures} failures")
            next_report[0] += 100_000

    next_report = [100_000]
    run()


class OverGrpc:
    """Counts of the gRPC sample."""

    def __init__(self) -> None:
        self.calls = self.answered = self.refused = self.statement_limit = 0
        self.internal = self.wrong_answers = 0
        self.errors: list[dict[str, str]] = []

    def _keep(self, kind: str, text: str, why: str) -> None:
        if len(self.errors) < KEPT_ERRORS:
            self.errors.append({"kind": kind, "text": text, "error": why})

    def judge(self, kind: str, text: str, error: grpc.aio.AioRpcError | None) -> None:
        """Answered, or refused at the parser's position; any other code is an internal error,
        any other answer (answered or refused against the parser, no position) a wrong one."""
        self.calls += 1
        refusal = check_query(text, kind).refusal  # type: ignore[arg-type]
        if error is None:
            if refusal is None:
                self.answered += 1
            else:
                self.wrong_answers += 1
                self._keep(kind, text, f"answered, but the parser refuses it: {refusal}")
            return
        code, details = error.code(), error.details() or ""
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_statement_time_s" in details:
            self.statement_limit += 1
        elif code != grpc.StatusCode.INVALID_ARGUMENT:
            self.internal += 1
            self._keep(kind, text, f"{code.name} {details!r}")
        else:
            description = _query_violation(error) or ""
            found = _POSITION.match(description)
            if refusal is None or not found or int(found.group(1)) != refusal.position:
                self.wrong_answers += 1
                self._keep(kind, text, f"refused with {description!r}; the parser: {refusal}")
            else:
                self.refused += 1


def _query_violation(error: grpc.aio.AioRpcError) -> str | None:
    """The description of the BadRequest violation on `query`, if there is one."""
    status = rpc_status.from_call(error)
    for detail in status.details if status is not None else []:
        bad = error_details_pb2.BadRequest()
        if detail.Unpack(bad):
            return next((v.description for v in bad.field_violations if v.field == "query"), None)
    return None


async def fuzz_over_grpc(ctx: BenchContext, sample: list[tuple[str, str]], counts: OverGrpc) -> None:
    """Each sampled input to ListBatches or ListJobs of a frontend process, judged."""
    with work_dir() as root:
        async with fresh_database(ctx.server, pool_size=4) as db, frontend_stack(db, root) as stack:
            store = JobStore(db)
            for i in range(20):
                await store.create_batch(stack.user, stack.billing_project, attributes={
                    "name": f"fuzz-{i}", "sample": f"S{i}", "note": "é \"quoted\" 100%_done"})
            metadata = (("authorization", f"Bearer {stack.token}"),)
            async with grpc.aio.secure_channel(stack.frontend_address, channel_credentials(stack.ca_cert)) as channel:
                batches = batch_service_pb2_grpc.BatchServiceStub(channel)
                jobs = job_service_pb2_grpc.JobServiceStub(channel)
                spec = job_spec_pb2.JobSpec(image="busybox", argv=job_spec_pb2.Argv(args=["true"]),
                                            attributes={"name": "fuzz-job"})
                batch_id = (await batches.SubmitBatch(bpb.SubmitBatchRequest(
                    idempotency_token=uuid.uuid4().hex,
                    billing_project=stack.billing_project, jobs=[spec] * 20), metadata=metadata)).batch.batch_id
                slots = asyncio.Semaphore(CONCURRENT_CALLS)

                async def send(kind: str, text: str) -> None:
                    async with slots:
                        try:
                            if kind == "batches":
                                await batches.ListBatches(bpb.ListBatchesRequest(query=text), metadata=metadata)
                            else:
                                await jobs.ListJobs(jpb.ListJobsRequest(batch_id=batch_id, query=text),
                                                    metadata=metadata)
                        except grpc.aio.AioRpcError as error:
                            counts.judge(kind, text, error)
                        else:
                            counts.judge(kind, text, None)

                await asyncio.gather(*(send(kind, text) for kind, text in sample))


async def run(ctx: BenchContext, args: argparse.Namespace) -> dict[str, Any]:
    n_inputs = args.inputs or (SMOKE_INPUTS if ctx.smoke else DEFAULT_INPUTS)
    n_sample = args.grpc_sample if args.grpc_sample is not None else (
        SMOKE_GRPC_SAMPLE if ctx.smoke else DEFAULT_GRPC_SAMPLE)
    local = InProcess(Sample(n_sample, args.seed))
    progress(f"{NAME}: {n_inputs:,} inputs in process, {args.mutants} mutants per hypothesis example")
    started = time.perf_counter()
    fuzz_in_process(n_inputs, args.mutants, local)
    elapsed_s = time.perf_counter() - started
    for name, value, unit in (("inputs", local.inputs, "inputs"),
                              ("inputs_per_s", round(local.inputs / elapsed_s), "inputs/s"),
                              ("parsed", local.parsed, "inputs"), ("refused", local.refused, "inputs"),
                              ("internal_errors", local.internal, "errors"),
                              ("property_failures", local.property_failures, "errors")):
        ctx.figures.add(f"{NAME}.{name}", value, unit)
    sample = local.sample.kept[True] + local.sample.kept[False]
    progress(f"{NAME}: {len(sample):,} of them over gRPC")
    remote = OverGrpc()
    await fuzz_over_grpc(ctx, sample, remote)
    for name, value, unit in (("calls", remote.calls, "calls"), ("answered", remote.answered, "calls"),
                              ("refused", remote.refused, "calls"),
                              ("statement_limit", remote.statement_limit, "calls"),
                              ("internal_errors", remote.internal, "errors"),
                              ("wrong_answers", remote.wrong_answers, "errors")):
        ctx.figures.add(f"{NAME}.grpc.{name}", value, unit)
    for error in local.errors + remote.errors:
        progress(f"{NAME}: FAILED on {error['kind']} query {error['text'][:300]!r}: {error['error']}")
    return {"smoke": ctx.smoke, "inputs": n_inputs, "mutants_per_example": args.mutants, "grpc_sample": n_sample,
            "seed": args.seed, "elapsed_s": round(elapsed_s, 1), "failures_in_process": local.errors,
            "failures_over_grpc": remote.errors}
