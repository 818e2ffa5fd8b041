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
from services.common.errors import FailedPrecondition, PermissionDenied, RequestError
from services.common.identity import current_principal
from services.db.database import Database
from services.db.store import JobStore
from services.driver.sessions import SessionRegistry, instance_token

log = logging.getLogger(__name__)

_FINAL = {job_state_pb2.JOB_STATE_SUCCEEDED: "Success", job_state_pb2.JOB_STATE_FAILED: "Failed",
          job_state_pb2.JOB_STATE_ERROR: "Error", job_state_pb2.JOB_STATE_CANCELLED: "Cancelled"}


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

    async def _check_token(self, instance: str, token: str) -> None:
        row = await self._db.fetchone("SELECT activation_token FROM instances WHERE name = %s", (instance,),
                                      name="instance_token")
        if row is None or not hmac.compare_digest(instance_token(row["activation_token"]), token):
            raise PermissionDenied(f"bad session token for instance {instance}")

    async def ActivateWorker(self, request: pb.ActivateWorkerRequest, context: grpc.aio.ServicerContext
                             ) -> pb.ActivateWorkerResponse:
        current_principal().require_service()
        epoch = self._leader_epoch()
        await self._store.activate_instance(epoch, request.instance_name, request.activation_token,
                                            request.address or "127.0.0.1")
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
        return pb.GetLeaderResponse(epoch=self._epoch() or 0, leader_address=self._leader_address())

    async def WorkerSession(self, request_iterator: AsyncIterator[pb.WorkerSessionRequest],
                            context: grpc.aio.ServicerContext) -> AsyncIterator[pb.WorkerSessionResponse]:
        current_principal().require_service()
        first = await anext(aiter(request_iterator), None)
        if first is None or first.WhichOneof("payload") != "hello":
            raise FailedPrecondition("a session starts with Hello")
        epoch = self._leader_epoch()
        instance = first.hello.instance_name
        await self._check_token(instance, first.hello.instance_token)
        session = self._sessions.open(instance)
        self._on_change("worker_connected")
        yield pb.WorkerSessionResponse(welcome=ws.Welcome(epoch=epoch, config=self._settings.proto()))

        async def consume() -> None:
            async for message in request_iterator:
                ack = await self._handle(epoch, instance, message)
                if ack:
                    session.commands.put_nowait(pb.WorkerSessionResponse(
                        ack_job_event=ws.AckJobEvent(event_id=message.event_id)))

        reader = asyncio.create_task(consume())
        try:
            while True:
                next_command = asyncio.create_task(session.commands.get())
                done, _ = await asyncio.wait({next_command, reader}, return_when=asyncio.FIRST_COMPLETED)
                if next_command in done:
                    yield next_command.result()
                    continue
                next_command.cancel()
                reader.result()  # re-raise what ended the worker's side, if anything
                return
        finally:
            reader.cancel()
            with contextlib.suppress(BaseException):
                await reader
            self._sessions.close(session)
            self._on_change("worker_disconnected")

    async def _handle(self, epoch: int, instance: str, message: pb.WorkerSessionRequest) -> bool:
        """Record one worker event; True when it must be acknowledged."""
        kind = message.WhichOneof("payload")
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
            await self._store.mark_jobs_started(epoch, instance, [{**ref,
                                                                   "start_time_ms": started.start_time.ToMilliseconds()}])
            job = await self._db.fetchone("SELECT cores_mcpu, memory_bytes FROM jobs WHERE batch_id = %s AND job_id = %s",
                                          (ref["batch_id"], ref["job_id"]), name="job_resources")
            if job is not None:
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
                "start_time_ms": done.start_time.ToMilliseconds() if done.HasField("start_time") else None,
                "end_time_ms": done.end_time.ToMilliseconds() if done.HasField("end_time") else None,
                "reason": job_pb2.AttemptEndReason.Name(done.end_reason).removeprefix("ATTEMPT_END_REASON_").lower()
                if done.end_reason else "completed"}])
            self._on_change("job_completed")
            return True
        return False
