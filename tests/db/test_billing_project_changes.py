"""The procedures that change billing projects: each locks the project row, checks its state there and
refuses with the typed error the frontend maps (services/frontend/billing_store.py)."""

from __future__ import annotations

import pytest

from services.db.database import (ConflictError, FailedPreconditionError, InvalidArgumentError, NotFoundError,
                                  ProcedureError)
from services.db.invariants import check_invariants
from services.frontend.billing_store import BillingStore, ProjectExists, StateRefuses, UnknownUser
from tests.world import World


async def users(world: World, *names: str) -> None:
    """Users of corral, as the auth service writes them (the `usernames` view shows their names)."""
    for name in names:
        await world.db.execute("INSERT INTO users (username, kind, roles, time_created_ms) VALUES (%s, 'person', "
                               "'user', 0)", (name,))


async def project(world: World, name: str) -> dict:
    row = await world.db.fetchone("SELECT state, limit_usd, max_job_duration_ms, time_created_ms FROM "
                                  "billing_projects WHERE name = %s", (name,))
    assert row is not None
    members = await world.db.fetchall("SELECT user FROM billing_project_members WHERE billing_project = %s "
                                      "ORDER BY user", (name,))
    return {**row, "members": [m["user"] for m in members]}


async def test_a_project_is_created_open_with_its_members(world: World) -> None:
    await users(world, "carol", "dave")
    await world.db.call("create_billing_project", "lab", ["dave", "carol", "dave"], 12.5, world.clock())
    assert await project(world, "lab") == {"state": "open", "limit_usd": 12.5, "max_job_duration_ms": 3_600_000,
                                           "time_created_ms": world.clock(), "members": ["carol", "dave"]}
    await world.db.call("create_billing_project", "nobody", [], None, world.clock())
    assert (await project(world, "nobody"))["members"] == []


async def test_a_taken_name_or_an_unknown_member_creates_nothing(world: World) -> None:
    await users(world, "carol")
    with pytest.raises(ConflictError, match="billing project proj exists"):
        await world.db.call("create_billing_project", "proj", ["carol"], None, world.clock())
    assert (await project(world, "proj"))["members"] == ["alice", "bob"]
    with pytest.raises(NotFoundError, match="no user mallory") as refused:
        await world.db.call("create_billing_project", "lab", ["zed", "carol", "mallory"], None, world.clock())
    assert refused.value.status["username"] == "mallory"  # the first unknown by name
    with pytest.raises(NotFoundError) as refused:  # names are compared exactly
        await world.db.call("create_billing_project", "lab", ["Carol"], None, world.clock())
    assert refused.value.status["username"] == "Carol"
    for members in ({"a": 1}, [None], [["carol"]]):
        with pytest.raises(InvalidArgumentError):
            await world.db.call("create_billing_project", "lab", members, None, world.clock())
    assert await world.db.fetchone("SELECT name FROM billing_projects WHERE name = 'lab'") is None
    assert await world.db.fetchone("SELECT user FROM billing_project_members WHERE billing_project = 'lab'") is None


async def test_members_limits_and_state_change_until_the_project_is_deleted(world: World) -> None:
    await users(world, "carol")
    await world.db.call("add_billing_project_member", "proj", "carol")
    await world.db.call("add_billing_project_member", "proj", "carol")  # idempotent
    await world.db.call("remove_billing_project_member", "proj", "bob")
    await world.db.call("remove_billing_project_member", "proj", "bob")  # idempotent
    with pytest.raises(NotFoundError, match="no user mallory") as refused:
        await world.db.call("add_billing_project_member", "proj", "mallory")
    assert refused.value.status["username"] == "mallory"
    await world.db.call("set_billing_project_limit", "proj", 3.0, 60_000)
    await world.db.call("set_billing_project_limit", "proj", 4.0, None)  # the duration stays
    assert await project(world, "proj") == {"state": "open", "limit_usd": 4.0, "max_job_duration_ms": 60_000,
                                            "time_created_ms": (await project(world, "proj"))["time_created_ms"],
                                            "members": ["alice", "carol"]}
    await world.db.call("set_billing_project_limit", "proj", None, None)
    assert (await project(world, "proj"))["limit_usd"] is None
    await world.db.call("set_billing_project_open", "proj", False)
    await world.db.call("set_billing_project_open", "proj", False)  # idempotent
    assert (await project(world, "proj"))["state"] == "closed"
    await world.db.call("set_billing_project_open", "proj", True)
    assert (await project(world, "proj"))["state"] == "open"
    with pytest.raises(InvalidArgumentError):
        await world.db.call("set_billing_project_open", "proj", None)
    for procedure, args in (("add_billing_project_member", ("carol",)), ("remove_billing_project_member", ("carol",)),
                            ("set_billing_project_limit", (1.0, None)), ("set_billing_project_open", (True,)),
                            ("delete_billing_project", ())):
        with pytest.raises(NotFoundError, match="no billing project gone") as refused:
            await world.db.call(procedure, "gone", *args)
        assert "username" not in refused.value.status
    assert await check_invariants(world.db) == []


async def test_only_a_closed_project_without_running_batches_is_deleted_with_its_secrets(world: World) -> None:
    with pytest.raises(FailedPreconditionError, match="billing project proj is open: close it before deleting it"):
        await world.db.call("delete_billing_project", "proj")
    batches = [(await world.batch([{}]))[0] for _ in range(6)]
    await world.db.execute("INSERT INTO secrets (billing_project, name, file_names, sealed, key_id, created_by, "
                           "time_created_ms) VALUES ('proj', 's', '[]', 'box', 'k', 'alice', 0)")
    await world.db.call("set_billing_project_open", "proj", False)
    with pytest.raises(FailedPreconditionError) as refused:
        await world.db.call("delete_billing_project", "proj")
    assert refused.value.message == f"billing project proj has running batches ({', '.join(map(str, batches[:5]))}, …)"
    for batch_id in batches[1:]:
        await world.store.cancel_job_group(batch_id, 0, "alice", "done")
        await world.db.execute("UPDATE batches SET state = 'complete' WHERE batch_id = %s", (batch_id,))
    with pytest.raises(FailedPreconditionError, match=rf"has running batches \({batches[0]}\)$"):
        await world.db.call("delete_billing_project", "proj")
    await world.db.execute("UPDATE batches SET state = 'complete' WHERE batch_id = %s", (batches[0],))
    await world.db.call("delete_billing_project", "proj")
    assert (await project(world, "proj"))["state"] == "deleted"
    assert await world.db.fetchone("SELECT name FROM secrets WHERE billing_project = 'proj'") is None
    status, _ = await world.db.call("delete_billing_project", "proj")  # again: nothing changes
    assert status["message"] == "already deleted"
    for procedure, args in (("add_billing_project_member", ("alice",)), ("remove_billing_project_member", ("bob",)),
                            ("set_billing_project_limit", (1.0, None)), ("set_billing_project_open", (True,))):
        with pytest.raises(FailedPreconditionError, match="billing project proj is deleted"):
            await world.db.call(procedure, "proj", *args)
    assert (await project(world, "proj"))["members"] == ["alice", "bob"]


async def test_the_frontend_store_turns_refusals_into_its_exceptions(world: World) -> None:
    store = BillingStore(world.db, world.clock)
    await users(world, "carol")
    with pytest.raises(ProjectExists):
        await store.create_project("proj", ["carol"], None)
    with pytest.raises(UnknownUser) as unknown:
        await store.create_project("lab", ["carol", "mallory"], None)
    assert unknown.value.username == "mallory"
    created = await store.create_project("lab", ["carol"], 2.0)
    assert (created.name, created.state, created.members, created.limit_usd) == ("lab", "open", ("carol",), 2.0)
    with pytest.raises(UnknownUser):
        await store.add_member("lab", "mallory")
    with pytest.raises(StateRefuses, match="billing project gone vanished"):
        await store.set_open("gone", False)
    with pytest.raises(StateRefuses, match="close it before deleting it"):
        await store.delete_project("lab")
    await store.set_open("lab", False)
    await store.delete_project("lab")
    with pytest.raises(StateRefuses, match="billing project lab is deleted"):
        await store.set_limit("lab", 1.0)


def test_a_refusal_carries_the_whole_status_row() -> None:
    from services.db.database import raise_for_status
    with pytest.raises(NotFoundError) as refused:
        raise_for_status("p", {"rc": 1, "message": "no user x", "username": "x"})
    assert refused.value.status == {"rc": 1, "message": "no user x", "username": "x"}
    assert ProcedureError("m").status == {}
