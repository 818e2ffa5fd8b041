"""Telling the driver that work appeared or was cancelled (DriverService.NotifyChange).

A user's RPC must never be slowed or failed by this: calling the notifier
only records the change and returns. One background task sends what has
accumulated, each distinct change once however often it was recorded (a
burst of commits to one batch is one notification), over mutual TLS with
the frontend's certificate to the leading driver, with a short deadline.
The leader is found by asking the configured drivers `GetLeader` in turn (a
standby names the leader); on any failure the leader is forgotten and found
again, and the change is retried once. What still fails is dropped: the
driver's loops also run on their period, so a lost notification only
delays them.

The same channels ask the leader what the live workers' image caches hold (`held_images`, for ListImages),
with the same deadline: a user's call waits on that one, and does without it when no driver answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Protocol

import grpc
from opentelemetry import context as otel_context

from corral.driver.v1 import driver_service_pb2 as pb
from corral.driver.v1 import driver_service_pb2_grpc
from services.common.tls import TlsFiles

log = logging.getLogger(__name__)

_KINDS = {"jobs_ready": pb.CHANGE_KIND_JOBS_READY, "batch_cancelled": pb.CHANGE_KIND_BATCH_CANCELLED,
          "job_group_cancelled": pb.CHANGE_KIND_JOB_GROUP_CANCELLED, "billing_changed": pb.CHANGE_KIND_BILLING_CHANGED}
Change = tuple[str, int, int, str]
"""(kind, batch_id, job_group_id, billing_project)."""


class DriversUnreachable(Exception):
    """No driver answered a question (the message says how it failed)."""


class Notify(Protocol):
    """What the servicers call when something changed; returns at once."""

    async def __call__(self, kind: str, batch_id: int, job_group_id: int = 0, billing_project: str = "") -> None: ...


async def no_notify(kind: str, batch_id: int, job_group_id: int = 0, billing_project: str = "") -> None:
    """The notifier of a frontend configured without drivers."""
    return None


class DriverNotifier:
    """Fire-and-forget, coalescing NotifyChange to the leader among `addresses`."""

    def __init__(self, tls: TlsFiles, addresses: Sequence[str], deadline_s: float = 1.0, max_pending: int = 1000):
        self._tls = tls
        self._addresses = tuple(addresses)
        self._deadline_s = deadline_s
        self._max_pending = max_pending
        # Insertion-ordered; each change keeps the trace context of the call
        # that first recorded it, so its NotifyChange joins that call's trace.
        self._pending: dict[Change, otel_context.Context] = {}
        self._wake = asyncio.Event()
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._leader: str | None = None
        self._task: asyncio.Task[None] | None = None
        self.sent = 0
        """Notifications the driver accepted (for tests and metrics)."""
        self.dropped = 0
        """Notifications given up on (the driver's period catches up)."""

    async def __call__(self, kind: str, batch_id: int, job_group_id: int = 0, billing_project: str = "") -> None:
        """Record a change for the sender; never waits on the driver."""
        if kind not in _KINDS:
            log.warning("not notifying the driver of unknown change %r", kind)
            return
        if len(self._pending) >= self._max_pending:
            # The driver is not keeping up or not reachable: one notification
            # wakes its loops as well as many would.
            self._pending.pop(next(iter(self._pending)))
            self.dropped += 1
        self._pending.setdefault((kind, batch_id, job_group_id, billing_project), otel_context.get_current())
        self._wake.set()
        if self._task is None and self._addresses:
            self.start()

    def start(self) -> None:
        """Start the sender task (on the running loop)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="driver-notifier")

    async def close(self) -> None:
        """Stop sending (pending changes are dropped) and close the channels."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close()

    def _stub(self, address: str) -> driver_service_pb2_grpc.DriverServiceStub:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = grpc.aio.secure_channel(address, self._tls.channel_credentials())
        return driver_service_pb2_grpc.DriverServiceStub(channel)

    async def _find_leader(self) -> str | None:
        for address in self._addresses:
            try:
                answer = await self._stub(address).GetLeader(pb.GetLeaderRequest(), timeout=self._deadline_s)
            except grpc.aio.AioRpcError as e:
                log.debug("driver %s did not answer GetLeader: %s", address, e.code().name)
                continue
            if answer.leader_address:
                return answer.leader_address
        return None

    async def _send(self, change: Change) -> bool:
        kind, batch_id, job_group_id, billing_project = change
        request = pb.NotifyChangeRequest(kind=_KINDS[kind], batch_id=batch_id, job_group_id=job_group_id,
                                         billing_project=billing_project)
        for _ in range(2):  # the known leader, then whoever leads now
            if self._leader is None:
                self._leader = await self._find_leader()
                if self._leader is None:
                    return False
            try:
                await self._stub(self._leader).NotifyChange(request, timeout=self._deadline_s)
                return True
            except grpc.aio.AioRpcError as e:
                log.info("notifying driver %s failed (%s); finding the leader again", self._leader, e.code().name)
                self._leader = None
        return False

    async def held_images(self) -> pb.ListHeldImagesResponse:
        """What the live workers' image caches hold, asked of the leader (ListHeldImages) as a change is sent:
        the known leader, then whoever leads now. Raises DriversUnreachable when no driver answers."""
        failure = "no driver is configured"
        for _ in range(2):
            if self._leader is None:
                self._leader = await self._find_leader()
                if self._leader is None:
                    raise DriversUnreachable("no driver answered with the leader's address")
            try:
                return await self._stub(self._leader).ListHeldImages(pb.ListHeldImagesRequest(),
                                                                     timeout=self._deadline_s)
            except grpc.aio.AioRpcError as e:
                failure = f"the leading driver did not answer ({e.code().name})"
                log.info("asking driver %s for the held images failed (%s); finding the leader again", self._leader,
                         e.code().name)
                self._leader = None
        raise DriversUnreachable(failure)

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._pending = list(self._pending.items()), {}
            for i, (change, trace_context) in enumerate(batch):
                token = otel_context.attach(trace_context)
                try:
                    delivered = await self._send(change)
                except Exception:  # noqa: BLE001 - a notification never takes the frontend down
                    log.exception("notifying the driver of %s failed", change)
                    delivered = False
                finally:
                    otel_context.detach(token)
                if delivered:
                    self.sent += 1
                    continue
                # No driver answers: do not spend a deadline per change on it.
                self.dropped += len(batch) - i
                break
