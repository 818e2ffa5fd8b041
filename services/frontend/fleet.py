"""FleetService: the deployment's pools and their instances, for administrators.

Everybody else is refused (PERMISSION_DENIED) before any request field is read: the fleet is the
operators' business, and its names and sizes say nothing a user needs to run jobs (ExplainJob tells a
user what their job waits for). Rows come from `services.frontend.fleet_store`.
"""

from __future__ import annotations

from typing import Any

import grpc

from corral.batch.v1 import fleet_pb2, fleet_service_pb2_grpc
from corral.batch.v1 import fleet_service_pb2 as pb
from services.common.errors import FieldViolation, InvalidRequest
from services.common.identity import current_principal
from services.frontend import page_tokens
from services.frontend.fleet_store import FleetStore
from services.frontend.job_protos import timestamp
from services.frontend.jobs import page_size
from services.frontend.notify import Notify, no_notify

_STATES = {"pending": fleet_pb2.INSTANCE_STATE_PENDING, "active": fleet_pb2.INSTANCE_STATE_ACTIVE,
           "inactive": fleet_pb2.INSTANCE_STATE_INACTIVE, "deleted": fleet_pb2.INSTANCE_STATE_DELETED}
_STATE_NAMES = {code: name for name, code in _STATES.items()}
_LIVE = ("pending", "active")


class FleetServicer(fleet_service_pb2_grpc.FleetServiceServicer):
    """See the module docstring."""

    def __init__(self, store: FleetStore, notify: Notify = no_notify):
        self.store = store
        self.notify = notify

    async def ListPools(self, request: pb.ListPoolsRequest, context: grpc.aio.ServicerContext
                        ) -> pb.ListPoolsResponse:
        current_principal().require_admin()
        return pb.ListPoolsResponse(pools=await self._pools())

    async def PausePool(self, request: pb.PausePoolRequest, context: grpc.aio.ServicerContext
                        ) -> pb.PausePoolResponse:
        principal = current_principal()
        principal.require_admin()
        await self.store.set_paused(request.pool, True, principal.name)
        return pb.PausePoolResponse(pool=(await self._pools(request.pool))[0])

    async def ResumePool(self, request: pb.ResumePoolRequest, context: grpc.aio.ServicerContext
                         ) -> pb.ResumePoolResponse:
        principal = current_principal()
        principal.require_admin()
        changed = await self.store.set_paused(request.pool, False, principal.name)
        if changed == "resumed":  # its ready jobs may start at the next cycle
            await self.notify("jobs_ready", 0)
        return pb.ResumePoolResponse(pool=(await self._pools(request.pool))[0])

    async def _pools(self, name: str | None = None) -> list[fleet_pb2.Pool]:
        deployment = await self.store.deployment()
        counts = await self.store.instance_counts()
        return [fleet_pb2.Pool(
            name=c.name, shared=c.is_pool, provider=c.provider, machine_type=c.machine_type,
            cores_mcpu=c.cores_mcpu, memory_bytes=c.memory_bytes, storage_bytes=c.storage_bytes, spot=c.spot,
            max_instances=c.max_instances, enabled=c.enabled, n_pending=counts.get((c.name, "pending"), 0),
            n_active=counts.get((c.name, "active"), 0), n_inactive=counts.get((c.name, "inactive"), 0),
            paused=c.paused_by is not None, paused_by=c.paused_by or "",
            paused_at=timestamp(c.time_paused_ms))
            for c in deployment.collections if name is None or c.name == name]

    async def ListInstances(self, request: pb.ListInstancesRequest, context: grpc.aio.ServicerContext
                            ) -> pb.ListInstancesResponse:
        current_principal().require_admin()
        violations = []
        if request.state != fleet_pb2.INSTANCE_STATE_UNSPECIFIED and request.state not in _STATE_NAMES:
            violations.append(FieldViolation("state", "unknown state"))
        after = page_tokens.decode(request.page_token) if request.page_token else ""
        if after is None:
            violations.append(FieldViolation("page_token", "not a token this service returned"))
        if request.page_size < 0:
            violations.append(FieldViolation("page_size", "must not be negative"))
        if violations:
            raise InvalidRequest(violations)
        limit = page_size(request.page_size)
        rows = await self.store.instances(request.pool, _STATE_NAMES.get(request.state), after or "", limit)
        return pb.ListInstancesResponse(
            instances=[_instance(r) for r in rows],
            next_page_token=page_tokens.encode(rows[-1]["name"]) if len(rows) == limit else "")


def _instance(row: dict[str, Any]) -> fleet_pb2.Instance:
    """An instance row of FleetStore; free cores only while it is pending or active (a deactivated one
    offers nothing)."""
    live = row["state"] in _LIVE
    return fleet_pb2.Instance(
        name=row["name"], pool=row["inst_coll"], state=_STATES[row["state"]], region=row["region"],
        machine_type=row["machine_type"] or "", spot=bool(row["preemptible"]), cores_mcpu=row["cores_mcpu"],
        free_cores_mcpu=row["free_cores_mcpu"] if live else None, memory_bytes=row["memory_bytes"],
        n_running_attempts=row["n_running_attempts"], created_at=timestamp(row["time_created_ms"]),
        activated_at=timestamp(row["time_activated_ms"]), last_heartbeat_at=timestamp(row["last_heartbeat_ms"]),
        deactivated_at=timestamp(row["time_deactivated_ms"]), deactivation_reason=row["deactivation_reason"] or "")
