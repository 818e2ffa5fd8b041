"""Issue 9, acceptance 7: every string and number field at its limit is
accepted, and one past it is INVALID_ARGUMENT naming the field; generated
from the protos and the tables of limits.

For every public RPC (the requests of tests/service/test_security.py, sent
by an administrator so that no permission check comes first), the test
walks the request's type, nested messages, lists and maps included, and
for each field with a limit in services/frontend/field_limits.py or
services/auth/field_limits.py sends the request with that field
- at its limit: the call may succeed or fail for another reason, but never
  with INTERNAL or UNKNOWN (a DataError) nor with the limit's own refusal;
- one past it (a character, a byte, an entry, one more or one less than
  the range): INVALID_ARGUMENT with a BadRequest naming the field, and
  nothing written.
A client stream's first message is walked (ImportImage's header), the
others sent as they are.
That each limit fits its column is tests/db/test_field_limits_schema.py;
that values at the limit are stored whole is the last test here.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor, message
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from corral.auth.v1 import auth_service_pb2 as apb
from corral.auth.v1 import user_pb2
from corral.batch.v1 import batch_service_pb2 as bpb
from corral.batch.v1 import job_group_pb2, job_spec_pb2, job_state_pb2
from corral.batch.v1 import job_service_pb2 as jpb
from services.auth.field_limits import AUTH_FIELD_LIMITS
from services.common.authz import allowed_callers
from services.common.fields import Integer, Limit, Map, Repeated, Text
from services.frontend.field_limits import request_field_limits
from services.frontend.limits import Limits
from tests.service.test_jobs import Env, refused, spec
from tests.service.test_security import (  # noqa: F401 - archive, callers, env, image_registry and world are fixtures
    CASES,
    Callers,
    Request,
    World,
    all_methods,
    archive,
    call_method,
    callers,
    env,
    image_registry,
    snapshot,
    world,
)

TABLE: dict[str, Limit] = {**request_field_limits(Limits()), **AUTH_FIELD_LIMITS}
F = descriptor.FieldDescriptor
INT_RANGES = {F.TYPE_INT32: (-(2**31), 2**31 - 1), F.TYPE_SINT32: (-(2**31), 2**31 - 1),
              F.TYPE_SFIXED32: (-(2**31), 2**31 - 1), F.TYPE_UINT32: (0, 2**32 - 1), F.TYPE_FIXED32: (0, 2**32 - 1),
              F.TYPE_INT64: (-(2**63), 2**63 - 1), F.TYPE_SINT64: (-(2**63), 2**63 - 1),
              F.TYPE_SFIXED64: (-(2**63), 2**63 - 1), F.TYPE_UINT64: (0, 2**64 - 1), F.TYPE_FIXED64: (0, 2**64 - 1)}
# Calls that change what other calls find (they go last, so the others meet the world whole).
DESTRUCTIVE = ("CancelBatch", "DeleteBatch", "CancelJobGroup", "CloseBillingProject", "DeleteBillingProject",
               "DeactivateUser", "RevokeToken", "RemoveMember")


# ---------------------------------------------------------------- values


def text_of(field: str, n: int, limit: Text) -> str:
    """A value of exactly `n` characters (or bytes, for a byte limit) that is otherwise
    valid where it is cheap to be: URLs, names, days."""
    if field.endswith(".callback_url"):
        return ("http://8.8.8.8/" + "x" * n)[:n]
    if field.endswith((".first_day", ".last_day")):
        return ("2026-01-01" + "x" * n)[:n]
    if field.endswith(("CreateBillingProjectRequest.name", ".members", "AddMemberRequest.username",
                       "RemoveMemberRequest.username", "CreateUserRequest.username",
                       "GetAttemptUsageRequest.attempt_id")):  # GetAttemptUsage checks an attempt id's letters
        return "a" * n
    if limit.max_chars is None:  # bytes: two-byte characters where they fit
        return "é" * (n // 2) + "x" * (n % 2)
    return "é" * n  # characters, not bytes: a VARCHAR(n) holds n of them


ELEMENTS: dict[str, Callable[[int], Any]] = {
    "corral.batch.v1.JobSpec": lambda i: spec(),
    "corral.batch.v1.JobGroupSpec": lambda i: job_group_pb2.JobGroupSpec(),
    "corral.batch.v1.ParentRef": lambda i: job_spec_pb2.ParentRef(in_update_offset=-1),
    "corral.batch.v1.JobLock": lambda i: job_spec_pb2.JobLock(level="level", mode=job_spec_pb2.LOCK_MODE_SHARED,
                                                              names=["name"]),
    "corral.batch.v1.InputFile": lambda i: job_spec_pb2.InputFile(from_url="file:///tmp/in", to_path="/in"),
    "corral.batch.v1.OutputFile": lambda i: job_spec_pb2.OutputFile(from_path="/out", to_url="file:///tmp/out"),
    "corral.batch.v1.SecretMount": lambda i: job_spec_pb2.SecretMount(name="s", mount_path="/s"),
}
SCALAR_ELEMENTS: dict[str, Callable[[int], Any]] = {
    "corral.batch.v1.JobSpec.regions": lambda i: "local",
    "corral.batch.v1.JobLock.names": lambda i: f"n{i}",
    "corral.batch.v1.ParentRef.accepted_states": lambda i: job_state_pb2.JOB_STATE_SUCCEEDED,
    "corral.batch.v1.RerunFailedJobsRequest.states": lambda i: job_state_pb2.JOB_STATE_FAILED,
    "corral.billing.v1.CreateBillingProjectRequest.members": lambda i: "a",
    "corral.auth.v1.CreateUserRequest.roles": lambda i: user_pb2.ROLE_USER,
}


def _map_value(field: F, text: str) -> str | bytes:
    """`text` as the map's values are: a bytes map (a secret's files) takes its UTF-8 (as many bytes)."""
    return text.encode() if field.message_type.fields_by_name["value"].type == F.TYPE_BYTES else text


def element_of(field: F, i: int) -> Any:
    if field.message_type is not None:
        return ELEMENTS[field.message_type.full_name](i)
    return SCALAR_ELEMENTS[field.full_name](i)


# ---------------------------------------------------------------- cases


@dataclasses.dataclass(frozen=True)
class Step:
    field: F
    index: int | None = None
    """The element of a list of messages the path goes through."""


@dataclasses.dataclass(frozen=True)
class FieldCase:
    """One field of one request and its limit: `part` is 'value', 'items' (a list's or map's
    size), 'element' (each element of a list), 'key' or 'map_value'."""

    steps: tuple[Step, ...]
    limit: Text | Integer | Repeated | Map
    part: str

    @property
    def field(self) -> F:
        return self.steps[-1].field

    @property
    def path(self) -> str:
        """The field as a BadRequest names it, e.g. `jobs[0].locks[0].names[0]`."""
        parts = [s.field.name + (f"[{s.index}]" if s.index is not None else "") for s in self.steps]
        return ".".join(parts) + ("[0]" if self.part == "element" else "")

    def __str__(self) -> str:
        return f"{self.path} ({self.part})"


def cases_of(message_type: descriptor.Descriptor, prefix: tuple[Step, ...] = ()) -> Iterator[FieldCase]:
    for field in message_type.fields:
        limit = TABLE.get(field.full_name)
        is_map = field.message_type is not None and field.message_type.GetOptions().map_entry
        if is_map:
            if isinstance(limit, Map):
                yield FieldCase((*prefix, Step(field)), limit, "items")
                for part, sub in (("key", limit.key), ("map_value", limit.value)):
                    if isinstance(sub, Text):
                        yield FieldCase((*prefix, Step(field)), limit, part)
        elif field.is_repeated:
            if isinstance(limit, Repeated):
                yield FieldCase((*prefix, Step(field)), limit, "items")
                if isinstance(limit.each, (Text, Integer)):
                    yield FieldCase((*prefix, Step(field)), limit, "element")
            if field.message_type is not None:
                yield from cases_of(field.message_type, (*prefix, Step(field, 0)))
        elif field.message_type is not None:
            if field.message_type.full_name.startswith("corral."):
                yield from cases_of(field.message_type, (*prefix, Step(field)))
        elif isinstance(limit, (Text, Integer)):
            yield FieldCase((*prefix, Step(field)), limit, "value")


def _holder(request: message.Message, steps: tuple[Step, ...]) -> message.Message:
    """The message that holds the last step's field, creating elements on the way."""
    holder = request
    for step in steps[:-1]:
        if step.index is None:
            holder = getattr(holder, step.field.name)
        else:
            container = getattr(holder, step.field.name)
            while len(container) <= step.index:
                container.append(element_of(step.field, len(container)))
            holder = container[step.index]
    return holder


def requests_at(base: message.Message, case: FieldCase) -> Iterator[tuple[str, message.Message]]:
    """(which, request) at the limit ('max') and past it ('max+1', 'min-1')."""
    def made(edit: Callable[[message.Message], None]) -> message.Message:
        request = type(base)()
        request.CopyFrom(base)
        edit(_holder(request, case.steps))
        return request

    field, name = case.field, case.field.name
    limit = case.limit
    if case.part == "items":
        assert isinstance(limit, (Repeated, Map))
        for which, n in (("max", limit.max_items), ("max+1", limit.max_items + 1)):
            def fill(holder: message.Message, n: int = n) -> None:
                holder.ClearField(name)
                if isinstance(limit, Map):
                    entries = getattr(holder, name)
                    for i in range(n):
                        if field.message_type.fields_by_name["value"].message_type is None:
                            entries[f"K{i}"] = _map_value(field, "v")
                else:
                    getattr(holder, name).extend(element_of(field, i) for i in range(n))
            yield which, made(fill)
        return
    if case.part in ("key", "map_value"):
        assert isinstance(limit, Map)
        text = limit.key if case.part == "key" else limit.value
        assert isinstance(text, Text)
        most = text.max_chars if text.max_chars is not None else text.max_bytes
        assert most is not None
        for which, n in (("max", most), ("max+1", most + 1)):
            value = text_of(field.full_name, n, text)

            def put(holder: message.Message, value: str = value) -> None:
                holder.ClearField(name)
                if case.part == "key":
                    getattr(holder, name)[value] = _map_value(field, "v")
                else:
                    getattr(holder, name)["k"] = _map_value(field, value)
            yield which, made(put)
        return
    scalar = limit.each if case.part == "element" else limit
    assert isinstance(scalar, (Text, Integer))

    def set_to(value: Any) -> Callable[[message.Message], None]:
        def edit(holder: message.Message) -> None:
            if case.part == "element":
                holder.ClearField(name)
                getattr(holder, name).append(value)
            else:
                setattr(holder, name, value)
        return edit

    if isinstance(scalar, Text):
        most = scalar.max_chars if scalar.max_chars is not None else scalar.max_bytes
        assert most is not None
        yield "max", made(set_to(text_of(field.full_name, most, scalar)))
        yield "max+1", made(set_to(text_of(field.full_name, most + 1, scalar)))
        return
    least, most = INT_RANGES[field.type]
    yield "max", made(set_to(scalar.max))
    if scalar.min != scalar.max:
        yield "min", made(set_to(scalar.min))
    if scalar.max < most:
        yield "max+1", made(set_to(scalar.max + 1))
    if scalar.min > least:
        yield "min-1", made(set_to(scalar.min - 1))


def base_requests(world: World) -> dict[str, tuple[message.Message, tuple[message.Message, ...]]]:
    """Method -> the message to walk and the ones that follow it (a client stream's)."""
    bases: dict[str, tuple[message.Message, tuple[message.Message, ...]]] = {}
    for method, case in CASES.items():
        request = case.request(world)
        bases[method] = (request[0], request[1:]) if isinstance(request, tuple) else (request, ())
    bases["/corral.auth.v1.AuthService/Login"] = (apb.LoginRequest(username="alice", password="not her password"), ())
    return bases


def test_every_public_method_is_walked_and_every_limited_field_is_reached() -> None:
    reached = {c.field.full_name for m in all_methods().values() for c in cases_of(m.input_type)}
    limited = {name for name, limit in TABLE.items() if isinstance(limit, (Text, Integer, Repeated, Map))}
    assert limited <= reached
    internal = {m for m in all_methods() if allowed_callers(m)}  # refused on public listeners: test_authz.py
    assert {*CASES, "/corral.auth.v1.AuthService/Login"} == set(all_methods()) - internal


# ---------------------------------------------------------------- the calls


def violated(error: grpc.aio.AioRpcError) -> dict[str, list[str]]:
    """Field -> descriptions of the BadRequest in the error, if any."""
    status = rpc_status.from_call(error)
    found: dict[str, list[str]] = {}
    for detail in status.details if status is not None else []:
        bad = error_details_pb2.BadRequest()
        if detail.Unpack(bad):
            for v in bad.field_violations:
                found.setdefault(v.field, []).append(v.description)
    return found


async def send(callers: Callers, method: str, request: message.Message, following: tuple[message.Message, ...],
               metadata: tuple) -> grpc.aio.AioRpcError | None:
    """The call's error, or None when it succeeds (a server stream that stays open succeeds); a client stream's
    messages are `request` then `following`."""
    service, _ = method.strip("/").split("/")
    descriptor = all_methods()[method]
    sent: Request = (request, *following) if descriptor.client_streaming else request
    try:
        await call_method(callers.stubs[service], descriptor, sent, metadata)
    except grpc.aio.AioRpcError as e:
        return e
    return None


SERVICES = ("corral.batch.v1.BatchService", "corral.batch.v1.JobService", "corral.batch.v1.JobGroupService",
            "corral.batch.v1.FleetService", "corral.batch.v1.LockService", "corral.batch.v1.SecretService",
            "corral.batch.v1.ImageService", "corral.billing.v1.BillingService", "corral.auth.v1.AuthService")


@pytest.mark.parametrize("service", SERVICES)
async def test_every_field_at_its_limit_passes_and_one_past_it_is_refused_naming_it(
        env: Env, callers: Callers, world: World, service: str) -> None:
    root = env.as_("root")
    bases = base_requests(world)
    methods = sorted((m for m in bases if m.startswith(f"/{service}/")),
                     key=lambda m: (m.rsplit("/", 1)[1] in DESTRUCTIVE, m))
    over: list[tuple[str, FieldCase, str, message.Message, tuple[message.Message, ...]]] = []
    checked_at_max = 0
    for method in methods:
        base, following = bases[method]
        for case in cases_of(base.DESCRIPTOR):
            for which, request in requests_at(base, case):
                if which.startswith("max+") or which.startswith("min-"):
                    over.append((method, case, which, request, following))
                    continue
                error = await send(callers, method, request, following, root)
                where = f"{method} {case} at {which}"
                if error is not None:
                    assert error.code() not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), \
                        f"{where}: {error.code().name} {error.details()}"
                    # Refused for another reason (the batch is closed, the name unknown, ...),
                    # but not by a limit on this field.
                    for field, descriptions in violated(error).items():
                        assert not (field.startswith(case.path.removesuffix("[0]"))
                                    and any(d.startswith("at most") or d.startswith("must be between")
                                            for d in descriptions)), f"{where}: {field} {descriptions}"
                checked_at_max += 1
    assert checked_at_max > 0
    before = await snapshot(env.world.db)
    for method, case, which, request, following in over:
        error = await send(callers, method, request, following, root)
        where = f"{method} {case} at {which}"
        assert error is not None, f"{where}: accepted"
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, f"{where}: {error.code().name} {error.details()}"
        named = violated(error)
        assert case.path in named, f"{where}: names {sorted(named)}"
    assert await snapshot(env.world.db) == before, "a refused request wrote something"


async def test_values_at_their_limits_are_stored_whole(env: Env, callers: Callers) -> None:
    """No column cuts a value the limits let through (MariaDB truncates silently inside
    JSON_TABLE): each comes back as it was sent, multi-byte characters included."""
    from corral.batch.v1 import job_group_service_pb2 as gpb

    alice, root = env.as_("alice"), env.as_("root")
    key, value = "é" * 100, "é" * 32_767 + "x"  # VARCHAR(100); TEXT's 65,535 bytes
    url, token, reason = "http://8.8.8.8/" + "x" * (2048 - 15), "é" * 93, "é" * 1024
    job = spec()
    job.attributes[key] = value
    job.locks.append(job_spec_pb2.JobLock(level="é" * 64, mode=job_spec_pb2.LOCK_MODE_SHARED, names=["é" * 255]))
    job.job_group.in_update_index = 0
    submitted = await env.batches.SubmitBatch(bpb.SubmitBatchRequest(
        billing_project="proj", attributes={key: value}, callback_url=url, idempotency_token=token, jobs=[job],
        job_groups=[job_group_pb2.JobGroupSpec(attributes={key: value})]), metadata=alice)
    batch_id = submitted.batch.batch_id
    assert dict(submitted.batch.attributes) == {key: value} and submitted.batch.callback_url == url
    got = await env.jobs.GetJob(jpb.GetJobRequest(batch_id=batch_id, job_id=1), metadata=alice)
    assert dict(got.job.attributes) == {key: value}
    group = await env.groups.GetJobGroup(gpb.GetJobGroupRequest(batch_id=batch_id, job_group_id=1), metadata=alice)
    assert dict(group.job_group.attributes) == {key: value}
    db = env.world.db
    assert await db.fetchall("SELECT level, lock_name FROM job_locks WHERE batch_id = %s", (batch_id,)) == [
        {"level": "é" * 64, "lock_name": "é" * 255}]
    assert await db.fetchone("SELECT b.idempotency_token AS batch, u.idempotency_token AS up FROM batches b"
                             " JOIN batch_updates u ON u.batch_id = b.batch_id WHERE b.batch_id = %s",
                             (batch_id,)) == {"batch": token, "up": token + "/submit"}
    cancelled = await env.batches.CancelBatch(bpb.CancelBatchRequest(batch_id=batch_id, reason=reason),
                                              metadata=alice)
    assert cancelled.batch.cancellation.reason == reason

    auth = callers.stubs["corral.auth.v1.AuthService"]
    user = await auth.CreateUser(apb.CreateUserRequest(username="a" * 64, display_name="é" * 255, email="é" * 255,
                                                       password="é" * 1024), metadata=root)
    assert (user.user.username, user.user.display_name, user.user.email) == ("a" * 64, "é" * 255, "é" * 255)
    created = await auth.CreateToken(apb.CreateTokenRequest(name="é" * 255, username="a" * 64), metadata=root)
    assert created.token.name == "é" * 255


async def test_attribute_keys_the_database_would_take_for_one_are_refused(env: Env) -> None:
    """utf8mb4_bin ignores trailing spaces: 'a' and 'a ' would be one primary key (once INTERNAL)."""
    alice = env.as_("alice")
    job = spec()
    job.attributes.update({"k": "1", "k ": "2"})
    for request, field in ((bpb.SubmitBatchRequest(idempotency_token=uuid.uuid4().hex,
                                                   billing_project="proj", attributes={"a": "", "a ": ""},
                                                   jobs=[spec()]), "attributes"),
                           (bpb.SubmitBatchRequest(idempotency_token=uuid.uuid4().hex,
                                                   billing_project="proj", jobs=[job]), "jobs[0].attributes"),
                           (bpb.SubmitBatchRequest(idempotency_token=uuid.uuid4().hex,
                                                   billing_project="proj", jobs=[spec()], job_groups=[
                               job_group_pb2.JobGroupSpec(attributes={"g": "", "g   ": ""})]), "job_groups[0].attributes")):
        error = await refused(env.batches.SubmitBatch(request, metadata=alice))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and field in violated(error), request
    assert await env.world.db.fetchone("SELECT COUNT(*) AS n FROM batches") == {"n": 0}
