"""DriverService: worker activation, worker sessions, change notifications.

The WorkerSession stream turns a worker's events into procedure calls:
heartbeats advance billing rollups, JobStarted/JobCompleted become MJS/MJC,
and each event is acknowledged (AckJobEvent) only after the database
recorded it, so a worker retries until it is durable and a repeat is
harmless (the procedures are idempotent). Heartbeats are acknowledged too,
once recorded: a worker that hears nothing from its driver for a while
takes it for paused or cut off and looks for the leader again.

Only the leader serves workers. A standby answers UNAVAILABLE naming the
leader, and GetLeader says who leads. A session belongs to the epoch that
welcomed it: when the driver stops leading (`end_sessions`), or finds at
the next pass of events that its epoch changed or lapsed, the session ends
with UNAVAILABLE naming the leader if known, and the worker finds it.

A new session starts with a RunJob for every attempt the database holds on
the worker that it has not reported started: one sent on a session that
broke, or scheduled by a leader that was paused before it could send, would
otherwise never reach the worker, and its job would wait until the worker
left. The worker ignores one it already has (or has run).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import grpc
from google.protobuf import duration_pb2

from corral.driver.v1 import driver_service_pb2 as pb
from corral.driver.v1 import driver_service_pb2_grpc, instance_pb2
from corral.driver.v1 import worker_session_pb2 as ws
from services.common.bunches import bunches
from services.common.errors import FailedPrecondition, FieldViolation, InvalidRequest, PermissionDenied, RequestError
from services.common.identity import current_principal
from services.common.session_protocol import PROTOCOL, spoken, worker_refusal
from services.driver.scheduler import Placement
from services.driver.held_images import held_images
from services.driver.sessions import Session, SessionRegistry, instance_token, reported_images, reported_names
from services.driver.store import DriverStore
from services.driver.worker_events import MAX_EVENTS_PER_PASS, WorkerEvents

log = logging.getLogger(__name__)

MAX_ADDRESS_CHARS = 64  # instances.ip_address


class NotLeader(RequestError):
    """This driver is a standby."""

    code = grpc.StatusCode.UNAVAILABLE


@dataclasses.dataclass(frozen=True)
class SessionSettings:
    """What workers are told in Welcome and ActivateWorker."""

    heartbeat_interval_s: float = 5.0
    heartbeat_timeout_s: float = 30.0
    idle_timeout_s: float = 60.0

    def proto(self) -> instance_pb2.SessionConfig:
        def d(seconds: float) -> duration_pb2.Duration:
            out = duration_pb2.Duration()
            out.FromMilliseconds(int(seconds * 1000))
            return out

        return instance_pb2.SessionConfig(heartbeat_interval=d(self.heartbeat_interval_s),
                                          heartbeat_timeout=d(self.heartbeat_timeout_s),
                                          idle_timeout=d(self.idle_timeout_s))


class DriverServicer(driver_service_pb2_grpc.DriverServiceServicer):
    """See the module docstring."""

    def __init__(self, store: DriverStore, sessions: SessionRegistry, epoch: Callable[[], int | None],
                 leader_address: Callable[[], str], on_change: Callable[[str], None],
                 settings: SessionSettings = SessionSettings(),
                 on_deactivated: Callable[[str], None] = lambda name: None,
                 on_ended: Callable[[Sequence[dict[str, Any]]], None] = lambda jobs: None,
                 placed: Callable[[], Awaitable[None]] | None = None):
        self._store = store
        self._sessions = sessions
        self._epoch = epoch
        self._leader_address = leader_address
        self._on_change = on_change
        self._settings = settings
        self._on_deactivated = on_deactivated
        """Called with an instance's name once its worker deactivated itself (idle, asked, or preempted)."""
        self._events = WorkerEvents(store, on_change, on_ended)
        self._placed = placed
        """Returns once the scheduler's cycle under way has ended (`Scheduler.placed`); None: no scheduler."""

    def _leader_epoch(self) -> int:
        epoch = self._epoch()
        if epoch is None:
            raise NotLeader(f"this driver is a standby; {self.leader_hint()}")
        return epoch

    def leader_hint(self) -> str:
        """Where the leader is, for a worker sent away."""
        address = self._leader_address()
        return f"the leader is at {address}" if address else "the leader is not known yet"

    def end_sessions(self, why: str) -> int:
        """End every worker session (this driver no longer leads), telling each worker `why` and where
        the leader is; returns how many."""
        return self._sessions.end_all(f"{why}; {self.leader_hint()}")

    async def close(self) -> None:
        """At the driver's stop, after the server: the combined pass of worker events under way ends (see
        WorkerEvents.close)."""
        await self._events.close()

    async def _check_token(self, instance: str, token: str) -> str:
        """The instance's state, once its session token is checked."""
        credentials = await self._store.worker_credentials(instance)
        if credentials is None or not hmac.compare_digest(instance_token(credentials.activation_token), token):
            raise PermissionDenied(f"bad session token for instance {instance}")
        return credentials.state

    @staticmethod
    def _require_own_instance(instance_name: str) -> None:
        """A worker's certificate names its instance: it speaks for that machine and no other."""
        principal = current_principal()
        if principal.name != f"worker-{instance_name}":
            raise PermissionDenied(f"{principal.name} may not act for instance {instance_name!r}")

    async def ActivateWorker(self, request: pb.ActivateWorkerRequest, context: grpc.aio.ServicerContext
                             ) -> pb.ActivateWorkerResponse:
        self._require_own_instance(request.instance_name)
        if request.address and not _is_host_port(request.address):
            raise InvalidRequest(FieldViolation("address", f"host:port of WorkerService, at most "
                                                           f"{MAX_ADDRESS_CHARS} characters"))
        epoch = self._leader_epoch()
        # instances.ip_address holds the host:port of the worker's WorkerService; the storage it reports,
        # its own disk's, replaces its pool's.
        await self._store.activate_instance(epoch, request.instance_name, request.activation_token,
                                            request.address or None, storage_bytes=max(0, request.storage_bytes))
        self._on_change("instance_active")
        return pb.ActivateWorkerResponse(instance_token=instance_token(request.activation_token),
                                         config=self._settings.proto(), epoch=epoch)

    async def DeactivateWorker(self, request: pb.DeactivateWorkerRequest, context: grpc.aio.ServicerContext
                               ) -> pb.DeactivateWorkerResponse:
        self._require_own_instance(request.instance_name)
        epoch = self._leader_epoch()
        await self._check_token(request.instance_name, request.instance_token)
        if request.reason == ws.DRAIN_REASON_PREEMPTION_NOTICE:
            await self._store.deactivate_instance(epoch, request.instance_name, "the cloud reclaimed the machine",
                                                  "preempted")
        else:
            await self._store.deactivate_instance(epoch, request.instance_name, "worker deactivated itself")
        self._on_change("instance_inactive")
        self._on_deactivated(request.instance_name)
        return pb.DeactivateWorkerResponse()

    async def NotifyChange(self, request: pb.NotifyChangeRequest, context: grpc.aio.ServicerContext
                           ) -> pb.NotifyChangeResponse:
        self._on_change(pb.ChangeKind.Name(request.kind))
        return pb.NotifyChangeResponse()

    async def GetLeader(self, request: pb.GetLeaderRequest, context: grpc.aio.ServicerContext) -> pb.GetLeaderResponse:
        epoch = self._epoch()
        # A worker behind the internal gateway is not told a driver's own address: it would call it
        # directly, around the gateway. It asks the gateway again, which finds the leader by health.
        address = "" if current_principal().through_gateway else self._leader_address()
        return pb.GetLeaderResponse(epoch=epoch or 0, leader_address=address, is_leader=epoch is not None)

    async def ListHeldImages(self, request: pb.ListHeldImagesRequest, context: grpc.aio.ServicerContext
                             ) -> pb.ListHeldImagesResponse:
        self._leader_epoch()  # only the leader holds the workers' sessions
        reports = self._sessions.image_reports()
        images, truncated = held_images(reports)
        return pb.ListHeldImagesResponse(images=images, workers=len(reports), truncated=truncated)

    async def WorkerSession(self, request_iterator: AsyncIterator[pb.WorkerSessionRequest],
                            context: grpc.aio.ServicerContext) -> AsyncIterator[pb.WorkerSessionResponse]:
        first = await anext(aiter(request_iterator), None)
        if first is None or first.WhichOneof("payload") != "hello":
            raise FailedPrecondition("a session starts with Hello")
        self._require_own_instance(first.hello.instance_name)
        epoch = self._leader_epoch()
        if first.hello.epoch_seen > epoch:
            raise NotLeader(f"this driver's epoch {epoch} is older than the worker's {first.hello.epoch_seen}")
        hello = first.hello
        instance = hello.instance_name
        if refusal := worker_refusal(spoken(hello.protocol)):
            log.warning("%s: %s", instance, refusal)
            raise FailedPrecondition(refusal)
        if await self._check_token(instance, hello.instance_token) != "active":
            raise FailedPrecondition(f"instance {instance} is not active: it was deactivated")
        session = self._sessions.open(instance)
        self._on_change("worker_connected")
        yield pb.WorkerSessionResponse(welcome=ws.Welcome(epoch=epoch, config=self._settings.proto(),
                                                          takes_event_bunches=True, protocol=PROTOCOL))
        # Queued before this session's first event is recorded, so before any acknowledgement of it: a
        # completion the worker re-sends is still unacknowledged there when the RunJob arrives.
        await self._resend_unstarted(instance)

        async def consume() -> None:
            # Messages are read as they arrive and recorded in passes: each
            # pass takes everything that came in while the previous one ran.
            inbox: asyncio.Queue[pb.WorkerSessionRequest | None] = asyncio.Queue()

            async def read() -> None:
                try:
                    async for message in request_iterator:
                        session.heard_at = time.monotonic()
                        for event in _unbunched(message):
                            inbox.put_nowait(event)
                finally:
                    inbox.put_nowait(None)

            reading = asyncio.create_task(read())
            try:
                ended = False
                while not ended:
                    messages = [await inbox.get()]
                    while not inbox.empty() and len(messages) < MAX_EVENTS_PER_PASS:
                        messages.append(inbox.get_nowait())
                    if None in messages:
                        ended = True
                        messages = [m for m in messages if m is not None]
                    if self._epoch() != epoch:  # stepped down, or leads again under a new epoch
                        raise NotLeader(f"this driver no longer leads under epoch {epoch}; {self.leader_hint()}")
                    # Shielded: a session that breaks mid-pass must not cut a procedure call (and its
                    # pooled connection) in half; the events are then recorded, and the worker's
                    # re-send is a repeat.
                    handling = asyncio.ensure_future(self._handle(epoch, session, messages))
                    handling.add_done_callback(_retrieve)
                    for event_id in await asyncio.shield(handling):
                        session.commands.put_nowait(pb.WorkerSessionResponse(
                            ack_job_event=ws.AckJobEvent(event_id=event_id)))
                await reading  # re-raise what ended the worker's side, if anything
            finally:
                reading.cancel()

        reader = asyncio.create_task(consume())
        next_command: asyncio.Task[pb.WorkerSessionResponse] | None = None
        try:
            while True:
                next_command = asyncio.create_task(session.commands.get())
                done, _ = await asyncio.wait({next_command, reader}, return_when=asyncio.FIRST_COMPLETED)
                if next_command in done:
                    # With what else is queued: one task and one wait per burst of commands, not per command,
                    # and one message per bunch to a worker that takes them.
                    commands = [next_command.result()]
                    while not session.commands.empty():
                        commands.append(session.commands.get_nowait())
                    ending = None in commands
                    commands = commands[:commands.index(None)] if ending else commands
                    for message in _bunched(commands) if hello.takes_command_bunches else commands:
                        yield message
                    if ending:
                        raise NotLeader(session.end_reason)
                    continue
                reader.result()  # re-raise what ended the worker's side, if anything
                return
        finally:
            if next_command is not None:
                next_command.cancel()
            reader.cancel()
            with contextlib.suppress(BaseException):
                await reader
            self._sessions.close(session)
            self._on_change("worker_disconnected")

    async def _resend_unstarted(self, instance: str) -> None:
        """RunJob again for the instance's open attempts that it never reported started (module docstring)."""
        attempts = await self._store.unstarted_attempts(instance)
        if attempts:
            log.info("%s: sending RunJob again for %d attempts it has not reported started", instance, len(attempts))
            await self._sessions.run([Placement(a.batch_id, a.job_id, a.attempt_id, instance, a.cores_mcpu)
                                      for a in attempts])

    async def _handle(self, epoch: int, session: Session, messages: list[pb.WorkerSessionRequest]) -> list[int]:
        """Record one pass of a worker's messages; returns the event ids to acknowledge."""
        instance = session.instance
        draining = False
        for message in messages:
            kind = message.WhichOneof("payload")
            if kind == "draining":
                session.draining = draining = True
                log.info("%s drains: %s", instance, ws.DrainReason.Name(message.draining.reason))
            elif kind == "image_cache":
                session.image_names = reported_names(message.image_cache)
                session.images = reported_images(message.image_cache)
            elif kind == "command_ack" and not message.command_ack.accepted:
                # A refused RunJob's attempt stays open until the worker deactivates (draining) or the
                # job's spec is reported as an Error (refused spec); see docs/known-limits.md.
                log.warning("%s refused command %d: %s", instance, message.command_ack.command_id,
                            message.command_ack.error_message)
        if draining and self._placed is not None:
            # A cycle that began before the Draining may still place jobs here; the worker deactivates
            # once its Draining is acknowledged and nothing runs. Acknowledged after that cycle, the ack
            # follows its Run commands on the session's one queue, so the worker sees them first and runs
            # them (else their attempts were lost with the worker; CI saw it in database-restart).
            await self._placed()
        recorded = await self._events.record(epoch, instance, messages)
        for ref, reason in recorded.stop:
            self._sessions.cancel(instance, ref["batch_id"], ref["job_id"], ref["attempt_id"], reason)
        return recorded.acks


MAX_BUNCH_COMMANDS = 500
"""Commands in one CommandBunch at most."""
MAX_BUNCH_BYTES = 1 << 20
"""A CommandBunch's commands' size at most (the worker takes messages of up to 4 MiB): a command larger than
this goes alone."""


def _bunched(commands: list[pb.WorkerSessionResponse]) -> list[pb.WorkerSessionResponse]:
    """The commands as messages for a worker that takes CommandBunch: a lone command as it is, several in
    bunches of at most MAX_BUNCH_COMMANDS and MAX_BUNCH_BYTES."""
    return [bunch[0] if len(bunch) == 1 else pb.WorkerSessionResponse(commands=pb.CommandBunch(commands=bunch))
            for bunch in bunches(commands, MAX_BUNCH_COMMANDS, MAX_BUNCH_BYTES)]


def _unbunched(message: pb.WorkerSessionRequest) -> list[pb.WorkerSessionRequest]:
    """A worker's message as the messages it carries: an EventBunch's, in order, or itself."""
    if message.WhichOneof("payload") != "events":
        return [message]
    events = list(message.events.events)
    for i, event in enumerate(events):
        if (kind := event.WhichOneof("payload")) in ("hello", "events", None):
            field, why = f"events.events[{i}]", (f"is {kind or 'empty'}: an EventBunch carries job events, "
                                                 "heartbeats, command acks and Draining, not Hello nor another bunch")
            raise InvalidRequest(FieldViolation(field, why), f"{field} {why}")
    return events


def _is_host_port(address: str) -> bool:
    host, _, port = address.rpartition(":")
    return len(address) <= MAX_ADDRESS_CHARS and bool(host) and port.isdigit() and 0 < int(port) < 65536


def _retrieve(task: asyncio.Future[bool]) -> None:
    """Mark a shielded event's failure as seen: its session reports it, or has already ended."""
    if not task.cancelled() and task.exception() is not None:
        log.debug("worker event failed: %r", task.exception())
