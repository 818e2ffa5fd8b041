"""DriverService: worker activation, worker sessions, change notifications.

The WorkerSession stream turns a worker's events into procedure calls:
heartbeats advance billing rollups, JobStarted/JobCompleted become MJS/MJC,
and each event is acknowledged (AckJobEvent) only after the database
recorded it, so a worker retries until it is durable and a repeat is
harmless (the procedures are idempotent). Only the leader serves workers;
a standby answers UNAVAILABLE and GetLeader says who leads.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import logging
from collections.abc import AsyncIterator, Callable

import grpc
from google.protobuf import duration_pb2

from corral.batch.v1 import job_pb2, job_state_pb2
from corral.driver.v1 import driver_service_pb2 as pb
from corral.driver.v1 import driver_service_pb2_grpc, instance_pb2
from corral.driver.v1 import worker_session_pb2 as ws
from services.common.errors import FailedPrecondition, FieldViolation, InvalidRequest, PermissionDenied, RequestError
from services.common.identity import current_principal
from services.db.database import Database
from services.db.store import JobStore
from services.driver.sessions import Session, SessionRegistry, instance_token

log = logging.getLogger(__name__)

_FINAL = {job_state_pb2.JOB_STATE_SUCCEEDED: "Success", job_state_pb2.JOB_STATE_FAILED: "Failed",
          job_state_pb2.JOB_STATE_ERROR: "Error", job_state_pb2.JOB_STATE_CANCELLED: "Cancelled"}

# MJS outcomes of an attempt that must not run: its job's group (or an
# ancestor) is cancelled, or the job is already final. The worker is told
# at once, even if the RunJob was still in flight when the batch was cancelled.
_STOP_AT_START = {"cancelled": "its job group or batch was cancelled",
                  "already_complete": "its job is already complete"}

MAX_ERROR_MESSAGE_CHARS = 8000
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

    def __init__(self, db: Database, store: JobStore, sessions: SessionRegistry, epoch: Callable[[], int | None],
                 leader_address: Callable[[], str], on_change: Callable[[str], None],
                 settings: SessionSettings = SessionSettings()):
        self._db = db
        self._store = store
        self._sessions = sessions
        self._epoch = epoch
        self._leader_address = leader_address
        self._on_change = on_change
        self._settings = settings

    def _leader_epoch(self) -> int:
        epoch = self._epoch()
        if epoch is None:
            raise NotLeader(f"this driver is a standby; the leader is at {self._leader_address() or 'unknown'}")
        return epoch

    async def _check_token(self, instance: str, token: str) -> str:
        """The instance's state, once its session token is checked."""
        row = await self._db.fetchone("SELECT activation_token, state FROM instances WHERE name = %s", (instance,),
                                      name="instance_token")
        if row is None or not hmac.compare_digest(instance_token(row["activation_token"]), token):
            raise PermissionDenied(f"bad session token for instance {instance}")
        return row["state"]

    async def ActivateWorker(self, request: pb.ActivateWorkerRequest, context: grpc.aio.ServicerContext
                             ) -> pb.ActivateWorkerResponse:
        current_principal().require_service()
        if request.address and not _is_host_port(request.address):
            raise InvalidRequest(FieldViolation("address", f"host:port of WorkerService, at most "
                                                           f"{MAX_ADDRESS_CHARS} characters"))
        epoch = self._leader_epoch()
        # instances.ip_address holds the host:port of the worker's WorkerService.
        await self._store.activate_instance(epoch, request.instance_name, request.activation_token,
                                            request.address or None)
        self._on_change("instance_active")
        return pb.ActivateWorkerResponse(instance_token=instance_token(request.activation_token),
                                         config=self._settings.proto(), epoch=epoch)

    async def DeactivateWorker(self, request: pb.DeactivateWorkerRequest, context: grpc.aio.ServicerContext
                               ) -> pb.DeactivateWorkerResponse:
        current_principal().require_service()
        epoch = self._leader_epoch()
        await self._check_token(request.instance_name, request.instance_token)
        await self._store.deactivate_instance(epoch, request.instance_name, "worker deactivated itself")
        self._on_change("instance_inactive")
        return pb.DeactivateWorkerResponse()

    async def NotifyChange(self, request: pb.NotifyChangeRequest, context: grpc.aio.ServicerContext
                           ) -> pb.NotifyChangeResponse:
        current_principal().require_service()
        self._on_change(pb.ChangeKind.Name(request.kind))
        return pb.NotifyChangeResponse()

    async def GetLeader(self, request: pb.GetLeaderRequest, context: grpc.aio.ServicerContext) -> pb.GetLeaderResponse:
        epoch = self._epoch()
        return pb.GetLeaderResponse(epoch=epoch or 0, leader_address=self._leader_address(),
                                    is_leader=epoch is not None)

    async def WorkerSession(self, request_iterator: AsyncIterator[pb.WorkerSessionRequest],
                            context: grpc.aio.ServicerContext) -> AsyncIterator[pb.WorkerSessionResponse]:
        current_principal().require_service()
        first = await anext(aiter(request_iterator), None)
        if first is None or first.WhichOneof("payload") != "hello":
            raise FailedPrecondition("a session starts with Hello")
        epoch = self._leader_epoch()
        if first.hello.epoch_seen > epoch:
            raise NotLeader(f"this driver's epoch {epoch} is older than the worker's {first.hello.epoch_seen}")
        instance = first.hello.instance_name
        if await self._check_token(instance, first.hello.instance_token) != "active":
            raise FailedPrecondition(f"instance {instance} is not active: it was deactivated")
        session = self._sessions.open(instance)
        self._on_change("worker_connected")
        yield pb.WorkerSessionResponse(welcome=ws.Welcome(epoch=epoch, config=self._settings.proto()))

        async def consume() -> None:
            async for message in request_iterator:
                # Shielded: a session that breaks mid-call must not cut a procedure call (and its pooled
                # connection) in half; the event is then recorded, and the worker's re-send is a repeat.
                handling = asyncio.ensure_future(self._handle(epoch, session, message))
                handling.add_done_callback(_retrieve)
                ack = await asyncio.shield(handling)
                if ack:
                    session.commands.put_nowait(pb.WorkerSessionResponse(
                        ack_job_event=ws.AckJobEvent(event_id=message.event_id)))

        reader = asyncio.create_task(consume())
        next_command: asyncio.Task[pb.WorkerSessionResponse] | None = None
        try:
            while True:
                next_command = asyncio.create_task(session.commands.get())
                done, _ = await asyncio.wait({next_command, reader}, return_when=asyncio.FIRST_COMPLETED)
                if next_command in done:
                    yield next_command.result()
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

    async def _handle(self, epoch: int, session: Session, message: pb.WorkerSessionRequest) -> bool:
        """Record one worker event; True when it must be acknowledged."""
        instance = session.instance
        kind = message.WhichOneof("payload")
        if kind == "draining":
            session.draining = True
            log.info("%s drains: %s", instance, ws.DrainReason.Name(message.draining.reason))
            return False
        if kind == "command_ack":
            if not message.command_ack.accepted:
                # A refused RunJob's attempt stays open until the worker deactivates (draining) or the
                # job's spec is reported as an Error (refused spec); see docs/architecture.md.
                log.warning("%s refused command %d: %s", instance, message.command_ack.command_id,
                            message.command_ack.error_message)
            return False
        if kind == "heartbeat":
            rollups = [{"batch_id": r.attempt.batch_id, "job_id": r.attempt.job_id,
                        "attempt_id": r.attempt.attempt_id, "rollup_time_ms": r.rollup_time.ToMilliseconds()}
                       for r in message.heartbeat.rollups]
            await self._store.heartbeat_rollup(epoch, instance, rollups)
            return False
        if kind == "job_started":
            started = message.job_started
            ref = {"batch_id": started.attempt.batch_id, "job_id": started.attempt.job_id,
                   "attempt_id": started.attempt.attempt_id}
            status = await self._store.mark_jobs_started(epoch, instance, [{
                **ref, "start_time_ms": started.start_time.ToMilliseconds(), "isolation": started.isolation}])
            outcome = status["outcomes"][0]["outcome"] if status["outcomes"] else "not_found"
            if outcome in _STOP_AT_START:
                self._sessions.cancel(instance, ref["batch_id"], ref["job_id"], ref["attempt_id"],
                                      _STOP_AT_START[outcome])
                return True
            job = await self._db.fetchone("SELECT cores_mcpu, memory_bytes FROM jobs WHERE batch_id = %s AND job_id = %s",
                                          (ref["batch_id"], ref["job_id"]), name="job_resources")
            if job is not None and outcome in ("started", "already_started"):
                await self._store.add_attempt_resources(epoch, [
                    {**ref, "resource": "cpu/local/1", "quantity": job["cores_mcpu"]},
                    {**ref, "resource": "memory/local/1", "quantity": job["memory_bytes"] // 2**20}])
            self._on_change("job_started")
            return True
        if kind == "job_completed":
            done = message.job_completed
            await self._store.mark_jobs_complete(epoch, instance, [{
                "batch_id": done.attempt.batch_id, "job_id": done.attempt.job_id, "attempt_id": done.attempt.attempt_id,
                "state": _FINAL.get(done.state, "Error"),
                "exit_code": done.exit_code if done.HasField("exit_code") else None,
                "error_message": done.error_message[:MAX_ERROR_MESSAGE_CHARS] or None,
                "cpu_time_ms": done.resources_used.cpu_time.ToMilliseconds()
                if done.resources_used.HasField("cpu_time") else None,
                "peak_memory_bytes": done.resources_used.peak_memory_bytes or None,
                "start_time_ms": done.start_time.ToMilliseconds() if done.HasField("start_time") else None,
                "end_time_ms": done.end_time.ToMilliseconds() if done.HasField("end_time") else None,
                "reason": job_pb2.AttemptEndReason.Name(done.end_reason).removeprefix("ATTEMPT_END_REASON_").lower()
                if done.end_reason else "completed"}])
            self._on_change("job_completed")
            return True
        return False


def _is_host_port(address: str) -> bool:
    host, _, port = address.rpartition(":")
    return len(address) <= MAX_ADDRESS_CHARS and bool(host) and port.isdigit() and 0 < int(port) < 65536


def _retrieve(task: asyncio.Future[bool]) -> None:
    """Mark a shielded event's failure as seen: its session reports it, or has already ended."""
    if not task.cancelled() and task.exception() is not None:
        log.debug("worker event failed: %r", task.exception())
