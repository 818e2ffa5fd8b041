"""The worker agent: activation, the session with the leading driver, jobs,
heartbeats, and leaving.

One agent per machine. It finds the leader among the drivers it was given
(a standby names the leader), activates with its one-time token, and keeps
one WorkerSession stream open, reconnecting (to a new leader after a
failover) whenever it breaks. Each RunJob becomes a task that runs the
attempt in the runtime, so the session never waits on a job. JobStarted
and JobCompleted are numbered events kept until the driver acknowledges
them and re-sent first on every new session; the driver's procedures make
a repeat harmless. Heartbeats carry a billing rollup per started attempt.

The worker follows the leader: a driver that stops leading ends the
session (UNAVAILABLE, naming the leader if it knows), and the worker looks
for the leader again. A paused driver cannot send anyone away, so the
worker also ends a session when the driver has said nothing for
`driver_silence_s` (it acknowledges every heartbeat once recorded, so a
healthy one speaks at least every heartbeat interval).

How it leaves (`run` returns the process's exit code):
- idle for the idle timeout: Draining(IDLE) (the driver schedules nothing
  more here), wait until the driver has heard it and every job it sent
  before has run, DeactivateWorker, exit 0;
- Drain from the driver: the same with Draining(REQUESTED), then wait for
  the completions to be acknowledged;
- SIGTERM (`shutdown`) or Shutdown from the driver: take no new jobs, bill
  the running ones up to now (a last heartbeat, kept until acknowledged),
  kill them without reporting them, give the driver a few seconds to
  acknowledge what already ended, DeactivateWorker (its running jobs go
  back to Ready and run again as new attempts), exit 0;
- SIGUSR1 (`preempted`): the cloud reclaims the machine (on a local worker,
  the stand-in for a spot machine's preemption notice): as SIGTERM, but
  DeactivateWorker says PREEMPTION_NOTICE, so the attempts end as preempted
  (RetryPolicy.max_preemptions_before_on_demand counts them);
- the driver refuses the instance (deactivated, unknown, bad token): kill
  everything and exit 3. Activation refused: exit 2.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

import grpc
from google.protobuf import timestamp_pb2

from corral import __version__
from corral.batch.v1 import job_pb2, job_state_pb2
from corral.driver.v1 import driver_service_pb2 as pb
from corral.driver.v1 import driver_service_pb2_grpc, instance_pb2
from corral.driver.v1 import worker_session_pb2 as ws
from services.common.bunches import bunches
from services.common.session_protocol import PROTOCOL, driver_refusal, spoken
from services.common.tls import TlsFiles
from services.common.usage_series import UsageSeries
from services.worker.attempts import (
    Attempt, AttemptTable, completed_event, log_url, resource_usage, run_attempt, timestamp, wall_ms,
)
from services.worker.config import WorkerConfig
from services.policy.sizes import binary_size
from services.worker.disk import free_bytes, out_of_space, ran_out
from services.worker.driver_link import REFUSED, DriverLink
from services.worker.image_report import ImageReporter
from services.worker.logs import LogSink
from services.worker.runtime import SYSTEM_ERROR, ContainerRuntime, JobOutcome, JobRun
from services.worker.pull_secrets import pull_credentials
from services.worker.secret_files import delivered_secrets
from services.worker.storage_check import file_url_refusals
from services.worker.usage_sampler import UsageSampler

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_ACTIVATION_REFUSED = 2
EXIT_DEACTIVATED = 3

MAX_BUNCH_EVENTS = 500
"""Messages in one EventBunch at most."""
MAX_BUNCH_BYTES = 48 * 1024
"""An EventBunch's size at most: the driver takes messages of up to 64 KiB."""
BUNCHED_EVENT_OVERHEAD_BYTES = 32
"""What a message adds to a bunch besides its own size now: its send time and its framing."""

DRAIN_FLUSH_S = 60.0
"""After a drain, how long to wait for the driver to acknowledge the last completions."""
DRAIN_SETTLE_S = 1.0
"""Once the driver has acknowledged a drain and nothing runs: how long a RunJob it sent before it heard of
the drain may still take to arrive (it runs, and the worker waits for it)."""


class DriverRefused(Exception):
    """This worker will not work for the session's driver (services.common.session_protocol)."""


class Stop(enum.Enum):
    """Why the worker leaves."""

    IDLE = "idle"
    DRAIN = "drain"
    SHUTDOWN = "shutdown"
    PREEMPTED = "preempted"
    REFUSED = "refused by the driver"


_DEACTIVATION_REASONS = {Stop.IDLE: ws.DRAIN_REASON_IDLE, Stop.PREEMPTED: ws.DRAIN_REASON_PREEMPTION_NOTICE}
"""What DeactivateWorker says for a stop (any other: REQUESTED)."""


class Worker:
    """See the module docstring. `run` drives it; the other public methods are
    what the process's signal handlers, WorkerService and tests use."""

    def __init__(self, config: WorkerConfig, runtime: ContainerRuntime, attempts: AttemptTable, tls: TlsFiles,
                 images: ImageReporter | None = None):
        self.config = config
        self._images = images
        """What the image cache holds, told to the driver (None: no cache, nothing told)."""
        self._images_told: ws.ImageCacheReport | None = None
        """The report this session's driver has, if any."""
        self.runtime = runtime
        self.attempts = attempts
        self.storage_bytes = config.storage_bytes or free_bytes(config.scratch_dir)
        """Scratch storage offered to jobs: as configured, else what the scratch disk had free when the worker
        started; reported at activation (the driver records it) and held against the attempts' reservations."""
        self._ids = itertools.count(1)
        self.unacked: dict[int, pb.WorkerSessionRequest] = {}
        """Events sent or to send, by event id, until the driver acknowledges them."""
        self.sessions_opened = 0
        """Sessions the driver welcomed, over the worker's life."""
        self.connected = False
        self.stop_reason: Stop | None = None
        self.started_at_ms = wall_ms()
        self._queue: asyncio.Queue[pb.WorkerSessionRequest] | None = None
        self._call: grpc.aio.StreamStreamCall | None = None
        self._link = DriverLink(config.driver_addresses, tls, config.rpc_timeout_s, config.reconnect_max_backoff_s,
                                query_timeout_s=config.leader_query_timeout_s)
        self.silences = 0
        """Sessions ended because the driver said nothing for too long."""
        self._heard_at = time.monotonic()
        self._token = ""
        self._heartbeat_s = config.heartbeat_interval_s
        self._event_bunches = False
        """This session's driver takes EventBunch (its Welcome said so)."""
        self._idle_timeout_s = config.idle_timeout_s
        self._last_busy = time.monotonic()
        self._drain_reason: int | None = None
        """Set while draining (idle or asked): sent again at the start of every session."""
        self._leaving = False
        """True once the worker deactivates, or kills its jobs to: from then on it refuses every RunJob."""
        # Replaced on every change; `_until` waits on the one it saw.
        self._changed = asyncio.Event()
        self._background: set[asyncio.Task[None]] = set()

    # -- what others call -----------------------------------------------------

    def shutdown(self) -> None:
        """SIGTERM: kill running jobs, deactivate, exit (see the module docstring)."""
        self._request_stop(Stop.SHUTDOWN)

    def preempted(self) -> None:
        """SIGUSR1: the machine is being reclaimed; leave as on SIGTERM, saying so (module docstring)."""
        self._request_stop(Stop.PREEMPTED)

    def drop_session(self) -> None:
        """Break the current session; the worker reconnects and re-sends what was not acknowledged."""
        if self._call is not None:
            self._call.cancel()

    @property
    def version(self) -> str:
        """Version of the worker software."""
        return __version__

    @property
    def driver_address(self) -> str:
        """The driver this worker holds a session with, or last found leading ('' while looking)."""
        return self._link.address

    @property
    def epoch_seen(self) -> int:
        """The highest leader epoch this worker has seen."""
        return self._link.epoch_seen

    @property
    def draining(self) -> bool:
        """True once the worker takes no new jobs."""
        return self.stop_reason is not None

    # -- the life of the worker -----------------------------------------------

    async def run(self, address: str) -> int:
        """Activate (advertising WorkerService at `address`), serve the driver until
        the worker leaves; returns the exit code."""
        sessions: asyncio.Task[None] | None = None
        idle: asyncio.Task[None] | None = None
        sampler: asyncio.Task[None] | None = None
        try:
            activated = await self._first(self._activate(address))
            if activated is None:
                return EXIT_OK  # asked to stop before activating: nothing to give back
            if not activated:
                return EXIT_ACTIVATION_REFUSED
            sessions = asyncio.create_task(self._keep_session())
            idle = asyncio.create_task(self._watch_idle())
            sampler = asyncio.create_task(UsageSampler(self.attempts, self.runtime,
                                                       self.config.usage_interval_s).run())
            await self._until(lambda: self.stop_reason is not None)
            return await self._leave(sessions)
        finally:
            for task in (sampler, idle, sessions):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(BaseException):
                        await task
            await self._abandon_running()
            await self._link.forget()

    async def _leave(self, sessions: asyncio.Task[None]) -> int:
        reason = self.stop_reason
        log.info("%s: leaving (%s)", self.config.instance_name, reason.value if reason else "?")
        if reason in (Stop.IDLE, Stop.DRAIN):
            await self._drain(ws.DRAIN_REASON_IDLE if reason is Stop.IDLE else ws.DRAIN_REASON_REQUESTED)
        self._leaving = True
        if self.stop_reason is Stop.REFUSED:
            await self._abandon_running()
            return EXIT_DEACTIVATED
        if self.attempts.running():
            # Deactivation ends their attempts where the last rollup left them: bill them up to now.
            self._emit(self._heartbeat())
        await self._abandon_running()
        flush_s = DRAIN_FLUSH_S if self.stop_reason is Stop.DRAIN else self.config.shutdown_flush_s
        if not await self._until(lambda: not self.unacked, flush_s):
            log.warning("%s: %d events not acknowledged; leaving anyway", self.config.instance_name,
                        len(self.unacked))
        sessions.cancel()
        with contextlib.suppress(BaseException):
            await sessions
        await self._deactivate(_DEACTIVATION_REASONS.get(reason, ws.DRAIN_REASON_REQUESTED))
        return EXIT_OK

    async def _drain(self, reason: int) -> None:
        """Tell the driver to schedule nothing more here, and wait until it has heard (a heartbeat sent after
        the Draining is acknowledged) and every attempt has ended, RunJobs it sent before it heard included:
        they run rather than being refused (a refused one would wait for the deactivation, and its job would
        run again as a new attempt). A SIGTERM or a refusal during the drain cuts it short."""
        self._drain_reason = reason
        self._send(pb.WorkerSessionRequest(draining=ws.Draining(reason=reason)))
        heard = self._emit(self._heartbeat())

        def drained() -> bool:
            return heard not in self.unacked and not self.attempts.running()

        def cut_short() -> bool:
            return self.stop_reason not in (Stop.IDLE, Stop.DRAIN)

        while not cut_short():
            await self._until(lambda: drained() or cut_short())
            if cut_short():
                return
            await asyncio.sleep(DRAIN_SETTLE_S)
            if drained():
                return

    def _request_stop(self, reason: Stop) -> None:
        # A stop can only get harsher: a drain becomes a shutdown, anything becomes a refusal.
        order = [Stop.IDLE, Stop.DRAIN, Stop.SHUTDOWN, Stop.PREEMPTED, Stop.REFUSED]
        if self.stop_reason is None or order.index(reason) > order.index(self.stop_reason):
            self.stop_reason = reason
            self._pulse()

    async def _watch_idle(self) -> None:
        while True:
            idle_for = time.monotonic() - self._last_busy
            if self.attempts.running() or self.unacked:
                self._last_busy = time.monotonic()
            elif idle_for >= self._idle_timeout_s:
                self._request_stop(Stop.IDLE)
                return
            await asyncio.sleep(min(0.5, max(0.05, self._idle_timeout_s - idle_for)))

    # -- finding the leader, activating, deactivating --------------------------

    async def _activate(self, address: str) -> bool:
        response = await self._link.activate(pb.ActivateWorkerRequest(
            instance_name=self.config.instance_name, activation_token=self.config.activation_token,
            cores_mcpu=self.config.cores_mcpu, memory_bytes=self.config.memory_bytes,
            storage_bytes=self.storage_bytes, region=self.config.region, address=address,
            version=__version__))
        if response is None:
            return False
        self._token = response.instance_token
        self._apply(response.config)
        log.info("%s: activated, WorkerService at %s", self.config.instance_name, address)
        return True

    async def _deactivate(self, reason: int) -> None:
        await self._link.deactivate(pb.DeactivateWorkerRequest(
            instance_name=self.config.instance_name, instance_token=self._token, reason=reason),
            self.config.deactivate_timeout_s)

    # -- the session ------------------------------------------------------------

    async def _keep_session(self) -> None:
        backoff_s = 0.1
        while True:
            stub = await self._link.leader()
            welcomed = self.sessions_opened
            try:
                await self._session(stub)
                why = "ended"
            except grpc.aio.AioRpcError as e:
                if e.code() in REFUSED:
                    log.error("%s: the driver refused the session: %s %s", self.config.instance_name,
                              e.code().name, e.details())
                    self._request_stop(Stop.REFUSED)
                    return
                why = f"{e.code().name}: {e.details()}"
            except DriverRefused as e:
                log.error("%s: leaving the session: %s", self.config.instance_name, e)
                self._request_stop(Stop.REFUSED)
                return
            log.warning("%s: session %s; looking for the leader", self.config.instance_name, why)
            await self._link.forget()
            if self.sessions_opened > welcomed:
                backoff_s = 0.1
            else:  # refused before Welcome (a deposed leader, say): do not spin
                await asyncio.sleep(backoff_s)
                backoff_s = min(self.config.reconnect_max_backoff_s, backoff_s * 2)

    async def _session(self, stub: driver_service_pb2_grpc.DriverServiceStub) -> None:
        call = stub.WorkerSession()
        queue: asyncio.Queue[pb.WorkerSessionRequest] = asyncio.Queue()
        queue.put_nowait(self._numbered(pb.WorkerSessionRequest(hello=ws.Hello(
            instance_name=self.config.instance_name, instance_token=self._token,
            epoch_seen=self._link.epoch_seen, takes_command_bunches=True, protocol=PROTOCOL))))
        self._event_bunches = False  # until this session's driver says it takes them
        if self._drain_reason is not None:  # a new driver must not schedule here either
            queue.put_nowait(self._numbered(pb.WorkerSessionRequest(draining=ws.Draining(reason=self._drain_reason))))
        for event in self.unacked.values():  # what the last session did not get acknowledged, in order
            queue.put_nowait(event)
        self._call, self._queue = call, queue
        self._heard_at = time.monotonic()
        writer = asyncio.create_task(self._write(call, queue))
        silence = asyncio.create_task(self._watch_silence(call))
        heartbeats: asyncio.Task[None] | None = None
        try:
            while True:
                message = await call.read()
                if message is grpc.aio.EOF:
                    return
                self._heard_at = time.monotonic()
                if message.WhichOneof("payload") == "welcome":
                    if refusal := driver_refusal(spoken(message.welcome.protocol)):
                        raise DriverRefused(refusal)
                    if heartbeats is None:
                        heartbeats = asyncio.create_task(self._heartbeats(queue))
                self._on_command(message)
        except asyncio.CancelledError:
            if asyncio.current_task().cancelling():  # type: ignore[union-attr]
                raise
            return  # drop_session cancelled the call, not us
        finally:
            self._call = self._queue = None
            self.connected = False
            for task in (writer, silence, heartbeats):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(BaseException):
                        await task
            call.cancel()

    async def _write(self, call: grpc.aio.StreamStreamCall, queue: asyncio.Queue[pb.WorkerSessionRequest]) -> None:
        while True:
            messages = [await queue.get()]
            if self._event_bunches:  # what else is queued goes in as few messages as the limits allow
                while not queue.empty():
                    messages.append(queue.get_nowait())
            for bunch in bunches(messages, MAX_BUNCH_EVENTS, MAX_BUNCH_BYTES, BUNCHED_EVENT_OVERHEAD_BYTES):
                now = timestamp(wall_ms())
                for message in bunch:
                    message.sent_at.CopyFrom(now)
                message = bunch[0] if len(bunch) == 1 else pb.WorkerSessionRequest(events=pb.EventBunch(events=bunch))
                try:
                    await call.write(message)
                except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError) as e:
                    log.debug("session write failed: %s", e)
                    return  # the read side sees the stream's end

    async def _watch_silence(self, call: grpc.aio.StreamStreamCall) -> None:
        """End the session once the driver has said nothing for too long (paused, or cut off from the
        database: either way it is not leading, or not for long)."""
        while True:
            bound_s = max(self.config.driver_silence_s, 2 * self._heartbeat_s)
            quiet_s = time.monotonic() - self._heard_at
            if quiet_s >= bound_s:
                log.warning("%s: no word from the driver at %s in %.1f s; looking for the leader again",
                            self.config.instance_name, self._link.address, quiet_s)
                self.silences += 1
                call.cancel()
                return
            await asyncio.sleep(bound_s - quiet_s)

    def _heartbeat(self) -> pb.WorkerSessionRequest:
        """A heartbeat: free resources, running attempts, and a billing rollup to now of each started one."""
        reserved = self.attempts.reserved()
        now = timestamp(wall_ms())
        running = self.attempts.running()
        return pb.WorkerSessionRequest(heartbeat=ws.Heartbeat(
            free_cores_mcpu=max(0, self.config.cores_mcpu - reserved.cores_mcpu),
            free_memory_bytes=max(0, self.config.memory_bytes - reserved.memory_bytes),
            running_attempts=[a.ref for a in running],
            rollups=[self._rollup(a, now) for a in running if a.started_ms is not None]))

    @staticmethod
    def _rollup(attempt: Attempt, now: timestamp_pb2.Timestamp) -> ws.BillingRollup:
        """Billing up to `now` (on the reserved resources: the usage sample is for the user to read)."""
        rollup = ws.BillingRollup(attempt=attempt.ref, rollup_time=now)
        if (latest := attempt.usage.latest) is not None:
            rollup.usage.CopyFrom(resource_usage(latest.reading.cpu_time_ms, latest.reading.peak_memory_bytes))
        return rollup

    async def _heartbeats(self, queue: asyncio.Queue[pb.WorkerSessionRequest]) -> None:
        while True:
            queue.put_nowait(self._numbered(self._heartbeat()))
            self._tell_images()
            await asyncio.sleep(self._heartbeat_s)

    def _tell_images(self) -> None:
        """Send the driver what the image cache holds, if it changed since this session's last report (a
        pull, an eviction, a job naming an image anew): looked at with each heartbeat, and when a job names an
        image anew."""
        if self._images is None or self._queue is None:
            return
        report = self._images.report()
        if report != self._images_told:
            self._images_told = report
            self._send(pb.WorkerSessionRequest(image_cache=report))

    def _on_command(self, message: pb.WorkerSessionResponse) -> None:
        kind = message.WhichOneof("payload")
        if kind == "welcome":
            self._link.saw_epoch(message.welcome.epoch)
            self._apply(message.welcome.config)
            self._event_bunches = message.welcome.takes_event_bunches
            self._images_told = None  # a new session's driver (perhaps a new leader) has none
            self.connected = True
            self.sessions_opened += 1
            self._pulse()
        elif kind == "commands":
            for command in message.commands.commands:
                if command.WhichOneof("payload") not in ("welcome", "commands"):
                    self._on_command(command)
        elif kind == "ack_job_event":
            self.unacked.pop(message.ack_job_event.event_id, None)
            self._pulse()
        elif kind == "run_job":
            refusal = self._start(message.run_job)
            self._ack(message.command_id, refusal)
        elif kind == "cancel_job":
            self._cancel(message.cancel_job)
            self._ack(message.command_id, "")
        elif kind == "drain":
            log.info("%s: the driver asks to drain: %s", self.config.instance_name, message.drain.reason)
            self._request_stop(Stop.DRAIN)
            self._ack(message.command_id, "")
        elif kind == "shutdown":
            log.info("%s: the driver asks to shut down: %s", self.config.instance_name, message.shutdown.reason)
            self._request_stop(Stop.SHUTDOWN)
            self._ack(message.command_id, "")

    def _ack(self, command_id: int, refusal: str) -> None:
        if command_id:
            self._send(pb.WorkerSessionRequest(command_ack=ws.CommandAck(
                command_id=command_id, accepted=not refusal, error_message=refusal)))

    def _apply(self, config: instance_pb2.SessionConfig) -> None:
        if config.heartbeat_interval.ToMilliseconds() > 0:
            self._heartbeat_s = config.heartbeat_interval.ToMilliseconds() / 1000
        if config.idle_timeout.ToMilliseconds() > 0:
            self._idle_timeout_s = config.idle_timeout.ToMilliseconds() / 1000

    def _numbered(self, message: pb.WorkerSessionRequest) -> pb.WorkerSessionRequest:
        message.event_id = next(self._ids)
        return message

    def _send(self, message: pb.WorkerSessionRequest) -> None:
        """Send on the current session, if any (not kept: only events are re-sent)."""
        if self._queue is not None:
            self._queue.put_nowait(self._numbered(message))

    def _emit(self, message: pb.WorkerSessionRequest) -> int:
        """Send an event the driver must acknowledge; kept and re-sent until it does. Returns its id."""
        self._numbered(message)
        self.unacked[message.event_id] = message
        if self._queue is not None:
            self._queue.put_nowait(message)
        return message.event_id

    # -- jobs ---------------------------------------------------------------------

    def _start(self, run: ws.RunJob) -> str:
        """Start an attempt for a RunJob; returns why it was refused, or ''."""
        key = (run.attempt.batch_id, run.attempt.job_id, run.attempt.attempt_id)
        if self.attempts.get(key) is not None or self._completion_unacked(run.attempt):
            return ""  # a re-sent RunJob: it runs, or ran, already
        if self._leaving or self.stop_reason in (Stop.SHUTDOWN, Stop.PREEMPTED, Stop.REFUSED):
            return self._never_ran(run, "the worker is leaving and takes no new jobs")
        if run.HasField("deadline") and run.deadline.ToMilliseconds() < wall_ms():
            return self._never_ran(run, "the RunJob arrived after its deadline")
        secrets, secret_refusals = delivered_secrets(run.spec, run.secrets)
        credentials, pull_refusals = pull_credentials(
            run.spec, run.image_pull_secret if run.HasField("image_pull_secret") else None,
            self.config.own_registry)
        secret_refusals += pull_refusals
        run.ClearField("secrets")  # their files live on in the JobRun alone, while the attempt runs
        run.ClearField("image_pull_secret")
        job = JobRun(run.attempt.batch_id, run.attempt.job_id, run.attempt.attempt_id, run.spec, run.cores_mcpu,
                     run.memory_bytes, self.config.scratch_dir, secrets, credentials, storage_bytes=run.storage_bytes)
        attempt = Attempt(ref=run.attempt, run=run, log=LogSink(job.log_path),
                          log_url=run.log_url or log_url(self.config.log_root_url, run.attempt),
                          no_room=self._no_room(run), secret_refusals=secret_refusals,
                          usage=UsageSeries(self.config.usage_samples_cap),
                          usage_interval_ms=round(self.config.usage_interval_s * 1000))
        self.attempts.add(attempt)
        self._last_busy = time.monotonic()
        attempt.task = asyncio.create_task(self._run(attempt, job))
        if attempt.no_room:  # it ends at once, as a system error: the driver runs it again elsewhere
            return attempt.no_room
        # A spec the runtime refuses still runs to an Error outcome (so the job says why); the ack says it too.
        return "; ".join(self.runtime.check(run.spec) + file_url_refusals(run.spec, run.storage_roots)
                         + secret_refusals)

    def _never_ran(self, run: ws.RunJob, refusal: str) -> str:
        """Refuse `run` and end its attempt at once, as a system error the driver runs again elsewhere: the
        refusal alone would leave the attempt open in the database until this worker is declared gone."""
        self._emit(pb.WorkerSessionRequest(job_completed=ws.JobCompleted(
            attempt=run.attempt, state=job_state_pb2.JOB_STATE_ERROR, error_message=f"{refusal}: not the job's failure",
            end_reason=job_pb2.AttemptEndReason.Value("ATTEMPT_END_REASON_" + SYSTEM_ERROR.upper()),
            end_time=timestamp(wall_ms()))))
        return refusal

    def _no_room(self, run: ws.RunJob) -> str:
        """Why `run` does not fit in what this worker has free now, in words ('' if it fits). The scheduler
        placed it by the database's view of the worker, which may be stale."""
        reserved = self.attempts.reserved()
        short = []
        if reserved.cores_mcpu + run.cores_mcpu > self.config.cores_mcpu:
            free_mcpu = self.config.cores_mcpu - reserved.cores_mcpu
            short.append(f"{run.cores_mcpu / 1000:g} cores asked, {free_mcpu / 1000:g} of "
                         f"{self.config.cores_mcpu / 1000:g} free")
        for what, asked, used, total in (("memory", run.memory_bytes, reserved.memory_bytes, self.config.memory_bytes),
                                         ("scratch storage", run.storage_bytes, reserved.storage_bytes,
                                          self.storage_bytes)):
            if total > 0 and used + asked > total:  # 0: the worker offers no amount of it, so holds none to it
                short.append(f"{binary_size(asked)} of {what} asked, {binary_size(max(0, total - used))} of "
                             f"{binary_size(total)} free")
        if not short:
            return ""
        return f"no room on the worker for the job now ({'; '.join(short)}): not the job's failure"

    def _completion_unacked(self, ref: ws.AttemptRef) -> bool:
        """Whether this worker ran the attempt and the driver has not yet recorded its end (an attempt it
        ended long ago has left the table, but its completion waits here until acknowledged)."""
        return any(m.WhichOneof("payload") == "job_completed" and m.job_completed.attempt == ref
                   for m in self.unacked.values())

    async def _run(self, attempt: Attempt, job: JobRun) -> None:
        def started(attempt: Attempt) -> None:
            self._emit(pb.WorkerSessionRequest(job_started=ws.JobStarted(
                attempt=attempt.ref, start_time=timestamp(attempt.started_ms or wall_ms()),
                isolation=self.runtime.isolation(job), image_digest=self.runtime.image_digest(job))))
            # It ran here, so its image is in the cache now: told at once the first time a job names it so (the
            # report is not rebuilt at every start: the next heartbeat tells of any other change).
            if self._images is not None and job.spec.image and self._images.ran(job.spec.image):
                self._tell_images()

        try:
            outcome = await run_attempt(self.runtime, attempt, job, started)
        except asyncio.CancelledError:
            self.attempts.end(attempt, None)
            self._pulse()
            raise
        except Exception as e:  # noqa: BLE001 - the worker failed around the job: report it, do not die
            log.exception("attempt %s failed in the worker", attempt.key)
            message = f"the worker failed: {ran_out(job.attempt_dir)}: {e}" if out_of_space(e) else \
                f"the worker failed: {e}"
            outcome = JobOutcome(state="Error", exit_code=None, error_message=message,
                                 start_time_ms=attempt.started_ms, end_time_ms=wall_ms(), end_reason=SYSTEM_ERROR,
                                 isolation=self.runtime.isolation(job))
        self.attempts.end(attempt, outcome)
        self._last_busy = time.monotonic()
        if not attempt.abandoned:
            self._emit(pb.WorkerSessionRequest(job_completed=completed_event(attempt, outcome)))
        self._pulse()

    def _cancel(self, cancel: ws.CancelJob) -> None:
        attempt = self.attempts.get((cancel.attempt.batch_id, cancel.attempt.job_id, cancel.attempt.attempt_id))
        if attempt is None or not attempt.running:
            return
        log.info("cancelling attempt %s: %s", attempt.key, cancel.reason)
        attempt.cancel_requested = True
        # Returns at once; the attempt's task then reports Cancelled.
        task = asyncio.create_task(self.runtime.cancel(attempt.ref.attempt_id))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _abandon_running(self) -> None:
        """Kill every running attempt without reporting it (the driver runs it again)."""
        running = [a for a in self.attempts.running() if a.task is not None]
        for attempt in running:
            attempt.abandoned = True
            attempt.task.cancel()  # type: ignore[union-attr]
        for attempt in running:
            with contextlib.suppress(BaseException):
                await attempt.task  # type: ignore[misc]

    # -- waiting ------------------------------------------------------------------

    def _pulse(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def _until(self, predicate: Callable[[], bool], timeout_s: float | None = None) -> bool:
        """Wait until `predicate()` holds (re-checked on every change); False on timeout."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not predicate():
            changed = self._changed
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            try:
                async with asyncio.timeout(remaining):
                    await changed.wait()
            except TimeoutError:
                return predicate()
        return True

    async def _first(self, activation: Coroutine[Any, Any, bool]) -> bool | None:
        """Activation's result, or None if a stop was asked for first."""
        task = asyncio.ensure_future(activation)
        stopped = asyncio.ensure_future(self._until(lambda: self.stop_reason is not None))
        try:
            done, _ = await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
            return task.result() if task in done else None
        finally:
            for t in (task, stopped):
                t.cancel()
                with contextlib.suppress(BaseException):
                    await t
