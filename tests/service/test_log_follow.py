"""StreamJobLog without an attempt id follows the job over real gRPC: it waits for a job that has not run,
follows each attempt (a retry too) and ends when the job is final; a job cancelled before it ran ends the
stream with its state, not an error; `corral logs -f` says what it waits for and how it ended, and
Ctrl-C ends it. Jobs are moved through their states with the driver's procedures
(`tests.world.World`), their logs put in storage as a worker uploads them."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time
from pathlib import Path

import grpc

from corral.batch.v1 import job_spec_pb2, job_state_pb2
from corral.batch.v1 import batch_service_pb2 as bpb
from corral.batch.v1 import job_service_pb2 as pb
from corral.cli_common import EXIT_INTERRUPTED
from services.auth.app import AuthApp
from services.common.tls import DevCertificateAuthority
from services.worker.logs import LogSink
from tests import ctrl_c
from tests.service.test_cli_jobs import logged_in
from tests.service.test_jobs import Env, complete, env, refused, spec  # noqa: F401 - env is a fixture


async def upload(env: Env, batch_id: int, job_id: int, attempt: str, text: bytes) -> None:
    """What the worker does at the end of an attempt: close its log and upload it."""
    sink = LogSink(env.blobs.parent / "worker" / f"{attempt}.log")
    sink.write(text)
    sink.close()
    await sink.upload(f"file://{env.blobs}/logs/{batch_id}/{job_id}/{attempt}/main.log")


class Reader:
    """Reads a stream's messages with a timeout. A read is never cancelled, which would cancel the call: one
    that times out is kept for the next."""

    def __init__(self, stream: grpc.aio.UnaryStreamCall):
        self.stream = stream
        self._read: asyncio.Future | None = None

    async def within(self, seconds: float) -> pb.StreamJobLogResponse | None:
        """The next message (EOF at the end), or None if none came within `seconds`."""
        if self._read is None:
            self._read = asyncio.ensure_future(self.stream.read())
        done, _ = await asyncio.wait({self._read}, timeout=seconds)
        if not done:
            return None
        message, self._read = self._read.result(), None
        return message

    async def next(self) -> pb.StreamJobLogResponse:
        message = await self.within(10)
        assert message is not None, "no message within 10 s"
        return message


async def test_a_pending_job_is_waited_for_then_each_attempt_followed_to_the_jobs_end(env: Env) -> None:
    w = env.world
    await w.instance()
    batch_id = await env.submit(spec(max_attempts=2, retry_policy=job_spec_pb2.RetryPolicy(max_failed_retries=1)))
    alice = env.as_("alice")
    # A one-shot read of a job that has not run still says so.
    one_shot = await refused(env.jobs.GetJobLog(pb.GetJobLogRequest(batch_id=batch_id, job_id=1), metadata=alice))
    assert (one_shot.code(), one_shot.details()) == (
        grpc.StatusCode.NOT_FOUND, f"job 1 of batch {batch_id} has not run yet: no log")

    stream = Reader(env.jobs.StreamJobLog(pb.StreamJobLogRequest(batch_id=batch_id, job_id=1), metadata=alice))
    assert await stream.next() == pb.StreamJobLogResponse()  # not run yet: the stream waits
    assert await stream.within(0.5) is None

    first = await w.run(batch_id, 1)
    header = await stream.next()
    assert (header.attempt_id, header.attempt_number, header.instance_name, header.data) == (first, 1, "i1", b"")
    await upload(env, batch_id, 1, first, b"try 1\n")
    await complete(env, batch_id, 1, first, "Failed", exit_code=1, reason="exited")
    log = await stream.next()
    assert (log.attempt_id, log.data, log.start_byte, log.attempt_number) == (first, b"try 1\n", 0, 1)
    assert await w.state(batch_id, 1) == "Ready"  # retried: the stream waits for the next attempt
    assert await stream.within(0.5) is None

    w.clock.advance(60_000)  # past the retry's delay
    second = await w.run(batch_id, 1)
    header = await stream.next()
    assert (header.attempt_id, header.attempt_number, header.data) == (second, 2, b"")
    await upload(env, batch_id, 1, second, b"try 2\n")
    await complete(env, batch_id, 1, second, "Success", exit_code=0)
    log = await stream.next()
    assert (log.attempt_id, log.data, log.attempt_number) == (second, b"try 2\n", 2)
    last = await stream.next()
    assert (last.attempt_id, last.data, last.job_state) == (second, b"", job_state_pb2.JOB_STATE_SUCCEEDED)
    assert await stream.next() == grpc.aio.EOF

    # Following the finished job again: its latest attempt's log, then its state.
    again = [m async for m in env.jobs.StreamJobLog(pb.StreamJobLogRequest(batch_id=batch_id, job_id=1),
                                                    metadata=alice)]
    assert [(m.attempt_id, m.data, m.job_state) for m in again] == [
        (second, b"", 0), (second, b"try 2\n", 0), (second, b"", job_state_pb2.JOB_STATE_SUCCEEDED)]


async def test_a_job_cancelled_before_it_ran_ends_the_follow_with_its_state(env: Env) -> None:
    w = env.world
    batch_id = await env.submit(spec(), spec())
    streams = [Reader(env.jobs.StreamJobLog(pb.StreamJobLogRequest(batch_id=batch_id, job_id=job_id),
                                            metadata=env.as_(who))) for job_id, who in ((1, "alice"), (2, "bob"))]
    for stream in streams:
        assert await stream.next() == pb.StreamJobLogResponse()
    # The waiting streams read nothing of their own: one statement a period serves them all.
    changes = env.frontend.job_changes
    reads, started_s = changes.reads, time.monotonic()
    await asyncio.sleep(1.0)
    periods = (time.monotonic() - started_s) / changes.period_s
    assert changes.reads - reads <= periods + 1

    await env.batches.CancelBatch(bpb.CancelBatchRequest(batch_id=batch_id, reason="stop"), metadata=env.as_("alice"))
    await w.drain(batch_id)
    for stream in streams:
        last = await stream.next()
        assert (last.attempt_id, last.data, last.job_state) == ("", b"", job_state_pb2.JOB_STATE_CANCELLED)
        assert await stream.next() == grpc.aio.EOF


async def test_a_worker_that_never_answers_does_not_hold_the_follow_past_the_attempts_end(env: Env) -> None:
    """A machine that vanished (preempted) closes no connection: the follow does not wait on its worker's
    silent stream once the attempt's end is recorded, and reads the rest from storage."""
    w = env.world
    await w.instance()
    with socket.socket() as silent:  # connections are accepted (the kernel's backlog), nothing is ever answered
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        await w.db.execute("UPDATE instances SET ip_address = %s WHERE name = 'i1'",
                           (f"127.0.0.1:{silent.getsockname()[1]}",))
        batch_id = await env.submit(spec())
        attempt = await w.run(batch_id, 1)
        stream = Reader(env.jobs.StreamJobLog(pb.StreamJobLogRequest(batch_id=batch_id, job_id=1),
                                              metadata=env.as_("alice")))
        assert (await stream.next()).attempt_id == attempt
        assert await stream.within(0.5) is None  # following the worker, which says nothing
        await upload(env, batch_id, 1, attempt, b"all of it\n")
        await complete(env, batch_id, 1, attempt, "Success", exit_code=0)
        log = await stream.next()  # within the grace of 5 s, not gRPC's 20 s to give up connecting
        assert (log.attempt_id, log.data) == (attempt, b"all of it\n")
        assert (await stream.next()).job_state == job_state_pb2.JOB_STATE_SUCCEEDED


async def test_corral_logs_follow_waits_says_why_it_ends_and_stops_at_ctrl_c(
        env: Env, auth_app: AuthApp, certs: DevCertificateAuthority, tmp_path: Path) -> None:
    """`corral logs -f` as a subprocess: on a job cancelled while it waits, it says so and exits 0; on one
    that keeps waiting, Ctrl-C ends it with 130, and its stream stops waiting on the server."""
    batch_id = await env.submit(spec(), spec())
    config = logged_in(env, auth_app, certs, tmp_path, "alice")
    waiting = f"job {{}} of batch {batch_id} has not run yet: waiting for it to start (Ctrl-C to stop)"
    followers = [await asyncio.create_subprocess_exec(
        sys.executable, "-m", "corral.cli", "logs", "-f", str(batch_id), str(job_id),
        env={**os.environ, "CORRAL_CONFIG": str(config)}, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, preexec_fn=ctrl_c.as_at_a_terminal) for job_id in (1, 2)]
    try:
        for job_id, follower in enumerate(followers, 1):
            assert follower.stderr is not None
            line = await asyncio.wait_for(follower.stderr.readline(), 30)
            assert line.decode().rstrip("\n") == waiting.format(job_id)

        followers[1].send_signal(signal.SIGINT)
        _, stderr = await asyncio.wait_for(followers[1].communicate(), 30)
        assert (followers[1].returncode, stderr) == (EXIT_INTERRUPTED, b"")
        changes = env.frontend.job_changes
        deadline = time.monotonic() + 10
        while (batch_id, 2) in changes.waiting_jobs:  # the server's stream went with the command
            assert time.monotonic() < deadline, "the interrupted follow's stream still waits on the server"
            await asyncio.sleep(0.05)

        await env.batches.CancelBatch(bpb.CancelBatchRequest(batch_id=batch_id, reason="stop"),
                                      metadata=env.as_("alice"))
        await env.world.drain(batch_id)
        stdout, stderr = await asyncio.wait_for(followers[0].communicate(), 30)
        assert (followers[0].returncode, stdout, stderr.decode()) == (
            0, b"", f"job 1 of batch {batch_id} was cancelled before it ran: it has no log\n")
    finally:
        for follower in followers:
            if follower.returncode is None:
                follower.kill()
                await follower.wait()
