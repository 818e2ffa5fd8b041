"""The worker's side of bunching on its session: it sends several messages in one EventBunch only once the
driver's Welcome said it takes them, within the bunch limits, in order, and it obeys every command of a
CommandBunch as if each came alone."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from corral.driver.v1 import driver_service_pb2 as pb
from corral.driver.v1 import worker_session_pb2 as ws
from services.worker import agent
from services.worker.agent import Worker
from services.worker.attempts import AttemptTable
from services.worker.config import WorkerConfig


class RecordingCall:
    """The session's call as the writer sees it: what it was given to write, message by message."""

    def __init__(self) -> None:
        self.written: list[pb.WorkerSessionRequest] = []

    async def write(self, message: pb.WorkerSessionRequest) -> None:
        self.written.append(message)


def worker(tmp_path: Path) -> Worker:
    config = WorkerConfig(instance_name="i1", activation_token="t", cores_mcpu=1000, driver_addresses=("x:1",),
                          certs_dir=tmp_path, scratch_dir=tmp_path, log_root_url="", storage_bytes=1 << 30)
    return Worker(config, runtime=None, attempts=AttemptTable(), tls=None)  # type: ignore[arg-type]


def heartbeat(event_id: int, padding: int = 0) -> pb.WorkerSessionRequest:
    return pb.WorkerSessionRequest(event_id=event_id, heartbeat=ws.Heartbeat(
        free_cores_mcpu=1, running_attempts=[ws.AttemptRef(attempt_id="x" * padding)] if padding else []))


async def written(w: Worker, messages: list[pb.WorkerSessionRequest]) -> list[pb.WorkerSessionRequest]:
    """What the writer sends for `messages`, queued at once."""
    queue: asyncio.Queue[pb.WorkerSessionRequest] = asyncio.Queue()
    for message in messages:
        queue.put_nowait(message)
    call = RecordingCall()
    writer = asyncio.create_task(w._write(call, queue))  # type: ignore[arg-type]
    while sum(len(m.events.events) or 1 for m in call.written) < len(messages):
        await asyncio.sleep(0)
    writer.cancel()
    return call.written


def flattened(sent: list[pb.WorkerSessionRequest]) -> list[int]:
    return [e.event_id for m in sent for e in (m.events.events if m.WhichOneof("payload") == "events" else [m])]


async def test_one_message_at_a_time_until_the_driver_says_it_takes_bunches(tmp_path: Path) -> None:
    w = worker(tmp_path)
    sent = await written(w, [heartbeat(i) for i in range(1, 4)])
    assert [m.WhichOneof("payload") for m in sent] == ["heartbeat"] * 3
    assert all(m.HasField("sent_at") for m in sent)

    w._on_command(pb.WorkerSessionResponse(welcome=ws.Welcome(epoch=1, takes_event_bunches=True)))
    sent = await written(w, [heartbeat(i) for i in range(4, 7)])
    assert [m.WhichOneof("payload") for m in sent] == ["events"]
    assert sent[0].event_id == 0 and flattened(sent) == [4, 5, 6]
    assert all(e.HasField("sent_at") for e in sent[0].events.events)
    alone = await written(w, [heartbeat(7)])
    assert [m.WhichOneof("payload") for m in alone] == ["heartbeat"]


async def test_a_bunch_keeps_within_its_limits_and_the_order(tmp_path: Path, monkeypatch: Any) -> None:
    w = worker(tmp_path)
    w._on_command(pb.WorkerSessionResponse(welcome=ws.Welcome(epoch=1, takes_event_bunches=True)))
    monkeypatch.setattr(agent, "MAX_BUNCH_EVENTS", 4)
    sent = await written(w, [heartbeat(i) for i in range(1, 11)])
    assert [len(m.events.events) or 1 for m in sent] == [4, 4, 2] and flattened(sent) == list(range(1, 11))

    big = [heartbeat(i, padding=20_000) for i in range(1, 6)]  # about 20 KB each
    sent = await written(w, big)
    assert flattened(sent) == [1, 2, 3, 4, 5]
    assert all(m.ByteSize() <= agent.MAX_BUNCH_BYTES for m in sent) and len(sent) == 3


async def test_every_command_of_a_bunch_is_obeyed(tmp_path: Path) -> None:
    w = worker(tmp_path)
    w.unacked = {1: heartbeat(1), 2: heartbeat(2), 3: heartbeat(3)}
    w._on_command(pb.WorkerSessionResponse(commands=pb.CommandBunch(commands=[
        pb.WorkerSessionResponse(ack_job_event=ws.AckJobEvent(event_id=1)),
        pb.WorkerSessionResponse(ack_job_event=ws.AckJobEvent(event_id=3)),
        # A bunch in a bunch is not the driver's to send, and is ignored.
        pb.WorkerSessionResponse(commands=pb.CommandBunch(commands=[
            pb.WorkerSessionResponse(ack_job_event=ws.AckJobEvent(event_id=2))]))])))
    assert list(w.unacked) == [2]


class Reports:
    """An image cache's reports, as the worker's ImageReporter gives them."""

    def __init__(self) -> None:
        self.now = ws.ImageCacheReport()

    def report(self) -> ws.ImageCacheReport:
        return self.now


async def test_the_image_cache_is_reported_when_a_session_opens_and_again_only_when_it_changes(tmp_path: Path) -> None:
    reports = Reports()
    w = worker(tmp_path)
    w._images = reports  # type: ignore[assignment]
    w._queue = asyncio.Queue()

    def told() -> list[ws.ImageCacheReport]:
        found = []
        while not w._queue.empty():  # type: ignore[union-attr]
            message = w._queue.get_nowait()  # type: ignore[union-attr]
            if message.WhichOneof("payload") == "image_cache":
                found.append(message.image_cache)
        return found

    w._on_command(pb.WorkerSessionResponse(welcome=ws.Welcome(epoch=1)))
    w._tell_images()
    assert told() == [ws.ImageCacheReport()]  # even empty: the new driver knows nothing yet
    w._tell_images()
    assert told() == []
    reports.now = ws.ImageCacheReport(images=[ws.CachedImage(digest="sha256:ab", names=["python:3.11"])])
    w._tell_images()
    w._tell_images()
    assert told() == [reports.now]
    w._on_command(pb.WorkerSessionResponse(welcome=ws.Welcome(epoch=2)))  # a new session, perhaps a new leader
    w._tell_images()
    assert told() == [reports.now]
