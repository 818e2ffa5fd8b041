"""The administrators' page: users, billing projects and their members, pools and their instances, and the
images of a project. Only administrators see it (the API refuses the others; the page says so first)."""

from __future__ import annotations

from aiohttp import web

from corral.auth.v1 import auth_service_pb2 as apb
from corral.auth.v1 import user_pb2
from corral.batch.v1 import fleet_pb2, image_pb2
from corral.batch.v1 import fleet_service_pb2 as flpb
from corral.batch.v1 import image_service_pb2 as ipb
from corral.billing.v1 import billing_project_pb2
from corral.billing.v1 import billing_service_pb2 as cpb
from corral.errors import FailedPrecondition, InvalidArgument, NotFound
from services.web import views
from services.web.app import BACKEND, render, session_of

SHOWN = 200
"""Rows of each table (each says when there are more)."""


async def admin_page(request: web.Request) -> web.Response:
    session = session_of(request)
    if not session.who.is_admin:
        return render(request, "error.html", status=403, title="Not allowed",
                      message="Only administrators see the administration pages.")
    backend = request.app[BACKEND]
    calls = session.calls
    users, projects = await calls.gather(
        calls.call(backend.users.ListUsers, apb.ListUsersRequest(page_size=SHOWN)),
        calls.call(backend.billing.ListBillingProjects, cpb.ListBillingProjectsRequest(page_size=SHOWN)))
    names = [p.name for p in projects.billing_projects]
    project = request.query.get("images", "")[:100] or ("default" if "default" in names else names[0] if names else "")
    images: list[image_pb2.Image] = []
    images_note = ""
    if project:
        try:
            images = list((await calls.call(backend.images.ListImages, ipb.ListImagesRequest(
                billing_project=project, page_size=SHOWN))).images)
        except (InvalidArgument, FailedPrecondition, NotFound) as e:
            images_note = e.message  # a deployment without its own registry, a project that is gone
    pools, instances = await _fleet(request)
    return render(request, "admin.html", title="Administration",
                  users=[{"name": u.username, "kind": _enum(u.kind, "USER_KIND_"), "roles": ", ".join(
                      _role(r) for r in u.roles), "state": _enum(u.state, "USER_STATE_"),
                          "created": views.when(u.created_at)} for u in users.users],
                  more_users=bool(users.next_page_token),
                  projects=[{"name": p.name, "state": _project_state(p.state), "members": ", ".join(p.members),
                             "limit": views.usd(p.limit_micro_usd) if p.HasField("limit_micro_usd") else "no limit",
                             "spend": views.usd(p.spend_micro_usd), "reserved": views.usd(p.reserved_micro_usd)}
                            for p in projects.billing_projects],
                  more_projects=bool(projects.next_page_token),
                  images_project=project,
                  images=[{"reference": i.reference, "digest": i.digest, "size": views.size(i.size_bytes),
                           "layers": i.layers} for i in images],
                  images_note=images_note, pools=pools, instances=instances)


def _enum(value: int, prefix: str) -> str:
    for enum in (user_pb2.UserKind, user_pb2.UserState):
        try:
            name = enum.Name(value)
        except ValueError:
            continue
        if name.startswith(prefix):
            return name.removeprefix(prefix).lower()
    return str(value)


def _role(value: int) -> str:
    return user_pb2.Role.Name(value).removeprefix("ROLE_").lower()


def _project_state(value: int) -> str:
    return billing_project_pb2.BillingProjectState.Name(value).removeprefix("BILLING_PROJECT_STATE_").lower()


INSTANCE_STATES = {"": 0, "pending": fleet_pb2.INSTANCE_STATE_PENDING, "active": fleet_pb2.INSTANCE_STATE_ACTIVE,
                   "inactive": fleet_pb2.INSTANCE_STATE_INACTIVE}


async def _fleet(request: web.Request) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """The pools with their instances by state, and the instances (the active ones unless ?instances=STATE)."""
    session = session_of(request)
    backend = request.app[BACKEND]
    state = INSTANCE_STATES.get(request.query.get("instances", "active"), fleet_pb2.INSTANCE_STATE_ACTIVE)
    pools, instances = await session.calls.gather(
        session.calls.call(backend.fleet.ListPools, flpb.ListPoolsRequest()),
        session.calls.call(backend.fleet.ListInstances, flpb.ListInstancesRequest(state=state, page_size=SHOWN)))
    return ([{"name": p.name, "machine_type": p.machine_type or "(cores and memory)", "cores": views.cores(p.cores_mcpu),
              "memory": views.size(p.memory_bytes), "spot": "yes" if p.spot else "no", "max": p.max_instances,
              "enabled": "yes" if p.enabled else "no",
              "by_state": f"{p.n_pending} pending, {p.n_active} active, {p.n_inactive} inactive"}
             for p in pools.pools],
            [{"name": i.name, "pool": i.pool,
              "state": fleet_pb2.InstanceState.Name(i.state).removeprefix("INSTANCE_STATE_").lower(),
              "cores": f"{views.cores(i.cores_mcpu)} ({views.cores(i.free_cores_mcpu)} free)"
              if i.HasField("free_cores_mcpu") else views.cores(i.cores_mcpu),
              "jobs": i.n_running_attempts, "heartbeat": views.when(i.last_heartbeat_at),
              "created": views.when(i.created_at)} for i in instances.instances])


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/admin", admin_page)
