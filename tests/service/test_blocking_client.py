"""`corral.Client` is `corral.aio.Client` run on an event loop thread of its own: the same calls, typed errors
as they are, lists paged lazily, streams ended when you stop reading, no thread left behind, and Ctrl-C
stopping a command at once. Against a small TLS server on loopback, in threads of its own (so that a call
from a test's running asyncio loop is answered), which records what it was asked."""

from __future__ import annotations

import asyncio
import gc
import inspect
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

import corral
from corral import aio
from corral.batch.v1 import batch_event_pb2, batch_pb2, batch_service_pb2, batch_service_pb2_grpc
from corral.cli_common import EXIT_INTERRUPTED
from services.common.tls import DevCertificateAuthority, TlsFiles
from tests import ctrl_c

WAIT_S = 30.0
MISSING = 404
"""GetBatch of this id is NOT_FOUND."""
STUCK = 999
"""GetBatch of this id answers only when the call ends (the client cancels it)."""
N_BATCHES = 5
SERVER_THREADS = "test-server"


class Batches(batch_service_pb2_grpc.BatchServiceServicer):
    """GetBatch, ListBatches (pages of `page_size`) and WatchBatch (events, then silence until the client
    goes away); records the page tokens asked for, the calls under way and how many ended."""

    def __init__(self) -> None:
        self.page_tokens: list[str] = []
        self.started = threading.Event()
        """A call of STUCK or a watch is under way."""
        self.n_ended = 0
        self.ended = threading.Condition()

    def _count_the_end(self, context: grpc.ServicerContext) -> threading.Event:
        """Count the call's end, whenever it comes; set the event returned then."""
        finished = threading.Event()

        def ended() -> None:
            with self.ended:
                self.n_ended += 1
                self.ended.notify_all()
            finished.set()

        context.add_callback(ended)
        return finished

    def wait_for_ended(self, n: int) -> bool:
        with self.ended:
            return self.ended.wait_for(lambda: self.n_ended >= n, WAIT_S)

    def GetBatch(self, request, context):  # noqa: N802 (gRPC's name)
        if request.batch_id == MISSING:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no batch {MISSING}")
        if request.batch_id == STUCK:
            finished = self._count_the_end(context)
            self.started.set()
            finished.wait()
        return batch_service_pb2.GetBatchResponse(batch=batch_pb2.Batch(
            batch_id=request.batch_id, state=batch_pb2.BATCH_STATE_RUNNING, counts=batch_pb2.JobCounts(n_jobs=1)))

    def ListBatches(self, request, context):  # noqa: N802
        self.page_tokens.append(request.page_token)
        first = int(request.page_token or 0)
        last = min(first + request.page_size, N_BATCHES)
        return batch_service_pb2.ListBatchesResponse(
            batches=[batch_pb2.Batch(batch_id=n) for n in range(first + 1, last + 1)],
            next_page_token=str(last) if last < N_BATCHES else "")

    def WatchBatch(self, request, context):  # noqa: N802
        finished = self._count_the_end(context)
        for event_id in range(request.from_event_id, request.from_event_id + 3):
            yield batch_service_pb2.WatchBatchResponse(event=batch_event_pb2.BatchEvent(
                batch_id=request.batch_id, event_id=event_id))
        self.started.set()
        finished.wait()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, TlsFiles, Batches]]:
    tls = TlsFiles.of(DevCertificateAuthority(tmp_path / "certs").issue_services().directory, "frontend")
    batches = Batches()
    grpc_server = grpc.server(futures.ThreadPoolExecutor(16, thread_name_prefix=SERVER_THREADS))
    batch_service_pb2_grpc.add_BatchServiceServicer_to_server(batches, grpc_server)
    port = grpc_server.add_secure_port("localhost:0", tls.server_credentials(require_client_cert=False))
    grpc_server.start()
    try:
        yield f"localhost:{port}", tls, batches
    finally:
        grpc_server.stop(None)


@pytest.fixture
def client(server: tuple[str, TlsFiles, Batches]) -> Iterator[corral.Client]:
    address, tls, _ = server
    with corral.Client(address, "token", ca_cert=tls.ca_cert) as opened:
        yield opened


def public_methods(cls: type) -> dict[str, inspect.Signature]:
    return {name: inspect.signature(member) for name, member in inspect.getmembers(cls, callable)
            if not name.startswith("_") and name not in ("close", "from_profile")}


def test_every_call_of_the_async_client_is_a_blocking_call_of_the_same_signature() -> None:
    blocking, asynchronous = public_methods(corral.Client), public_methods(aio.Client)
    assert sorted(blocking) == sorted(asynchronous)
    for name, signature in asynchronous.items():
        assert blocking[name].parameters == signature.parameters, name
        assert getattr(corral.Client, name).__doc__ == getattr(aio.Client, name).__doc__, name
    # What help() shows: the blocking client's own return types.
    assert blocking["get_batch"].return_annotation == "batch_pb2.Batch"
    assert blocking["watch"].return_annotation == "Iterator[batch_event_pb2.BatchEvent]"
    assert blocking["jobs"].return_annotation == "Iterator[job_pb2.Job]"


def test_results_and_typed_errors_pass_through(client: corral.Client, server) -> None:
    assert client.get_batch(7).batch_id == 7
    with pytest.raises(corral.NotFound, match=f"no batch {MISSING}") as missing:
        client.get_batch(MISSING)
    assert missing.value.code == grpc.StatusCode.NOT_FOUND
    # Mistakes found before any call are UsageError, raised in the caller's thread.
    with pytest.raises(corral.UsageError, match="unknown state"):
        client.rerun_failed(7, ["bogus"])
    with pytest.raises(corral.UsageError, match="auth_address"):
        client.users()


def test_a_list_is_read_a_page_at_a_time_as_it_is_iterated(client: corral.Client, server) -> None:
    _, _, batches = server
    listed = client.list_batches(page_size=2)
    assert batches.page_tokens == []  # nothing asked for before the first item is wanted
    assert [next(listed).batch_id for _ in range(3)] == [1, 2, 3]
    assert batches.page_tokens == ["", "2"]
    listed.close()
    assert [b.batch_id for b in client.list_batches(page_size=2)] == [1, 2, 3, 4, 5]
    assert batches.page_tokens == ["", "2", "", "2", "4"]


def test_leaving_a_stream_early_ends_it_on_the_server(client: corral.Client, server) -> None:
    _, _, batches = server
    for event in client.watch(7, from_event_id=5):
        if event.event_id == 6:
            break  # the iterator is dropped here, and its stream cancelled
    assert batches.wait_for_ended(1)
    kept = client.watch(7)
    assert next(kept).event_id == 1
    kept.close()
    assert batches.wait_for_ended(2)


def test_closing_the_client_ends_its_open_streams_and_refuses_later_calls(server) -> None:
    address, tls, batches = server
    client = corral.Client(address, "token", ca_cert=tls.ca_cert)
    events = client.watch(7)
    assert next(events).event_id == 1
    client.close()
    assert batches.wait_for_ended(1)
    client.close()  # a second close is a no-op
    with pytest.raises(corral.UsageError, match="closed"):
        client.get_batch(7)
    with pytest.raises(corral.UsageError, match="closed"):
        next(events)


def client_side_threads() -> set[threading.Thread]:
    """This process's threads but the server's (whose pool grows as calls come)."""
    return {t for t in threading.enumerate() if not t.name.startswith(SERVER_THREADS)}


def test_many_clients_opened_and_closed_leave_no_thread_behind(server) -> None:
    """Only threads started here count: one an earlier test left (a pool winding down) may end meanwhile."""
    address, tls, _ = server
    before = client_side_threads()
    for n in range(30):
        with corral.Client(address, "token", ca_cert=tls.ca_cert) as client:
            assert client.get_batch(n).batch_id == n
            assert next(client.list_batches(page_size=1)).batch_id == 1  # an iterator left open
            assert len(client_side_threads() - before) == 1  # the client's own
    assert client_side_threads() - before == set()
    # Nor does a client dropped without close(), once it is collected.
    dropped = corral.Client(address, "token", ca_cert=tls.ca_cert)
    assert dropped.get_batch(1).batch_id == 1
    del dropped
    gc.collect()
    assert client_side_threads() - before == set()


def test_an_iterator_keeps_its_client_open(server) -> None:
    address, tls, _ = server
    listed = corral.Client(address, "token", ca_cert=tls.ca_cert).list_batches(page_size=2)  # client unnamed
    gc.collect()
    assert [b.batch_id for b in listed] == [1, 2, 3, 4, 5]


async def test_a_blocking_call_from_a_running_asyncio_loop_works(server) -> None:
    """It blocks the caller's loop while it waits, as any blocking call does; the server here runs in
    threads of its own, so it answers."""
    address, tls, _ = server
    with corral.Client(address, "token", ca_cert=tls.ca_cert) as client:
        assert client.get_batch(7).batch_id == 7
        assert [b.batch_id for b in client.list_batches()] == [1, 2, 3, 4, 5]
    await asyncio.sleep(0)  # the test's own loop is fine


@pytest.mark.parametrize("command", [["status", str(STUCK)], ["wait", "7"]])
def test_ctrl_c_stops_a_command_at_once(server, tmp_path: Path, command: list[str]) -> None:
    """A unary call (GetBatch) and a stream (`corral wait` follows WatchBatch) that never answer: SIGINT,
    as Ctrl-C sends it, ends the command (with exit code 130 and no traceback) instead of the wait."""
    address, tls, batches = server
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"frontend": address, "auth": "localhost:1", "ca_cert": str(tls.ca_cert),
                                  "token": "token"}))
    # PYTHONFAULTHANDLER: a command that does not end is sent SIGABRT, and its threads' stacks say where it hung.
    with subprocess.Popen([sys.executable, "-m", "corral.cli", *command],
                          env={**os.environ, "CORRAL_CONFIG": str(config), "PYTHONFAULTHANDLER": "1"},
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          preexec_fn=ctrl_c.as_at_a_terminal) as process:
        try:
            assert batches.started.wait(WAIT_S), "the call never reached the server"
            process.send_signal(signal.SIGINT)
            _, stderr = process.communicate(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGABRT)
            _, stderr = process.communicate(timeout=WAIT_S)
            raise AssertionError(f"Ctrl-C did not end the command; where it was:\n{stderr.decode()}") from None
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert process.returncode == EXIT_INTERRUPTED, stderr
    assert b"Traceback" not in stderr, stderr
    assert batches.wait_for_ended(1)
