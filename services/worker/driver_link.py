"""The worker's way to the leading driver.

A worker is given every driver's address. `DriverLink.leader` asks them all
GetLeader at once, each with a short deadline (a paused driver accepts the
connection and never answers; asked one by one, it held up every round for
a whole call timeout). The first that answers `is_leader` with an epoch no
older than the highest seen is used; a standby's answer names the leader,
which is asked too if it was not. The channel is kept until the session
with it ends and the agent `forget`s it. The highest epoch seen is kept as
well: the worker sends it in Hello, and a driver with an older one is
stale. Activation and deactivation are plain calls on the leader, retried
on a new leader; the driver's refusal of the instance is final.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import grpc

from corral.driver.v1 import driver_service_pb2 as pb
from corral.driver.v1 import driver_service_pb2_grpc
from services.common.tls import TlsFiles

log = logging.getLogger(__name__)

REFUSED = (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION,
           grpc.StatusCode.INVALID_ARGUMENT)
"""Codes by which the driver refuses this instance: retrying cannot help."""


class NoDriver(Exception):
    """No driver answered GetLeader."""


class DriverLink:
    """A channel to the leading driver, found among `addresses`."""

    def __init__(self, addresses: tuple[str, ...], tls: TlsFiles, rpc_timeout_s: float, max_backoff_s: float,
                 query_timeout_s: float = 2.0):
        self._addresses = addresses
        self._tls = tls
        self._rpc_timeout_s = rpc_timeout_s
        self._query_timeout_s = min(query_timeout_s, rpc_timeout_s)
        self._max_backoff_s = max_backoff_s
        self._channel: grpc.aio.Channel | None = None
        self._stub: driver_service_pb2_grpc.DriverServiceStub | None = None
        self.address = ""
        """The leader's address while a channel to it is kept, else ''."""
        self.epoch_seen = 0
        """Highest leader epoch seen (GetLeader, ActivateWorker, Welcome)."""

    def saw_epoch(self, epoch: int) -> None:
        """Remember a leader epoch a driver announced."""
        self.epoch_seen = max(self.epoch_seen, epoch)

    async def leader(self, patient: bool = True) -> driver_service_pb2_grpc.DriverServiceStub:
        """A stub on the leading driver, looking for it (with back-off) if needed. Not `patient`:
        raises NoDriver when no driver answers at all (they are gone, e.g. shutting down)."""
        backoff_s = 0.1
        while self._stub is None:
            answered = await self._search()
            if self._stub is not None:
                break
            if not answered and not patient:
                raise NoDriver("no driver answers")
            await asyncio.sleep(backoff_s)
            backoff_s = min(self._max_backoff_s, backoff_s * 2)
        return self._stub

    async def _ask(self, address: str) -> tuple[grpc.aio.Channel, pb.GetLeaderResponse | None]:
        """GetLeader of one driver on a new channel; the answer is None if it gave none in time (the
        channel is then closed)."""
        channel = grpc.aio.secure_channel(address, self._tls.channel_credentials())
        try:
            answer = await driver_service_pb2_grpc.DriverServiceStub(channel).GetLeader(
                pb.GetLeaderRequest(), timeout=self._query_timeout_s)
        except grpc.aio.AioRpcError as e:
            log.debug("driver %s did not answer GetLeader: %s", address, e.code())
            await channel.close()
            return channel, None
        except BaseException:
            await channel.close()
            raise
        return channel, answer

    async def _search(self) -> bool:
        """One round of asking every driver (and any leader a standby names) at once; keeps the first
        leader found. Returns whether any driver answered."""
        asking = {asyncio.create_task(self._ask(a)): a for a in dict.fromkeys(self._addresses)}
        asked, answered = set(asking.values()), False
        try:
            while asking and self._stub is None:
                done, _ = await asyncio.wait(asking, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    address = asking.pop(task)
                    channel, answer = task.result()
                    if answer is None:
                        continue
                    answered = True
                    if self._stub is None and answer.is_leader and answer.epoch >= self.epoch_seen:
                        self.saw_epoch(answer.epoch)
                        self._channel, self.address = channel, address
                        self._stub = driver_service_pb2_grpc.DriverServiceStub(channel)
                        log.info("the leader is %s (epoch %d)", address, answer.epoch)
                        continue
                    await channel.close()
                    named = answer.leader_address
                    if named and named not in asked:  # a standby named a leader we were not given
                        asked.add(named)
                        asking[asyncio.create_task(self._ask(named))] = named
        finally:
            for task in asking:
                task.cancel()
            for task in asking:
                with contextlib.suppress(BaseException):
                    channel, _ = await task
                    await channel.close()
        return answered

    async def forget(self) -> None:
        """The leader failed a call or went quiet: look for it again next time."""
        if self._channel is not None:
            await self._channel.close()
        self._channel = self._stub = None
        self.address = ""

    async def activate(self, request: pb.ActivateWorkerRequest) -> pb.ActivateWorkerResponse | None:
        """ActivateWorker on the leader, until it answers; None if it refuses the instance."""
        while True:
            stub = await self.leader()
            try:
                response = await stub.ActivateWorker(request, timeout=self._rpc_timeout_s)
            except grpc.aio.AioRpcError as e:
                if e.code() in REFUSED:
                    log.error("%s: activation refused: %s %s", request.instance_name, e.code().name, e.details())
                    return None
                log.warning("%s: activation failed (%s); trying again", request.instance_name, e.code().name)
                await self.forget()
                continue
            self.saw_epoch(response.epoch)
            return response

    async def deactivate(self, request: pb.DeactivateWorkerRequest, timeout_s: float) -> None:
        """DeactivateWorker on the leader, for at most `timeout_s`; gives up at once when no driver
        answers (the dead-worker detector deactivates the instance then)."""
        async def deactivate() -> None:
            while True:
                try:
                    stub = await self.leader(patient=False)
                except NoDriver:
                    log.warning("%s: no driver answers; leaving without DeactivateWorker", request.instance_name)
                    return
                try:
                    await stub.DeactivateWorker(request, timeout=self._rpc_timeout_s)
                    log.info("%s: deactivated", request.instance_name)
                    return
                except grpc.aio.AioRpcError as e:
                    if e.code() in REFUSED:
                        log.warning("%s: DeactivateWorker refused: %s", request.instance_name, e.details())
                        return
                    await self.forget()

        try:
            async with asyncio.timeout(timeout_s):
                await deactivate()
        except TimeoutError:
            log.warning("%s: no driver took DeactivateWorker in %g s", request.instance_name, timeout_s)
