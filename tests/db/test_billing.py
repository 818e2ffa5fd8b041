"""Billing acceptance: after attempts with resources and rollups, the
aggregates by job, job group, batch, billing project and billing
project/user/day equal the cost computed directly from attempts x rates.

The scenario drives the stored procedures through a `Ledger` that keeps,
in plain Python, what every attempt has consumed according to the
documented rules (usage = quantity x rolled-up milliseconds; rollups only
move forward and stop at the attempt's end; an attempt whose instance is
deactivated is billed only up to what its worker last reported; a resource
recorded late is billed at once for the time already rolled up; usage lands
on the UTC day of the rollup time that advanced it). The database's aggregates are then
compared with the ledger: usage exactly, dollars to a relative 1e-9.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
from collections import defaultdict
from typing import Any

import pytest

from services.db.database import FailedPreconditionError, InvalidArgumentError, StaleEpochError
from services.db.invariants import check_invariants
from tests.world import World, job_spec

MIN_MS = 60_000
DAY_MS = 86_400_000
# The first UTC midnight after FakeClock's start (1_700_000_000_000 is
# 2023-11-14T22:13:20Z): 2023-11-15T00:00:00Z.
MIDNIGHT_MS = 1_700_006_400_000
assert MIDNIGHT_MS % DAY_MS == 0
DAY_1 = datetime.date(2023, 11, 14)
DAY_2 = datetime.date(2023, 11, 15)


def t(minutes: float) -> int:
    """Milliseconds since the epoch, `minutes` from the midnight."""
    return MIDNIGHT_MS + int(minutes * MIN_MS)


def utc_day(ms: int) -> datetime.date:
    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.timezone.utc).date()


@dataclasses.dataclass
class Batch:
    batch_id: int
    user: str
    billing_project: str
    group_ids: dict[str, int]
    """Group name -> id; 'root' is 0."""
    parents: dict[int, int | None]
    """Group id -> parent group id (None for the root)."""
    jobs: dict[str, tuple[int, int]]
    """Job name -> (job_id, job_group_id)."""

    def ancestors(self, group_id: int) -> list[int]:
        chain: list[int] = []
        g: int | None = group_id
        while g is not None:
            chain.append(g)
            g = self.parents[g]
        return chain


@dataclasses.dataclass
class Attempt:
    batch: Batch
    job: str
    attempt_id: str
    instance: str
    start_ms: int | None = None
    rollup_ms: int | None = None
    end_ms: int | None = None
    quantities: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def job_id(self) -> int:
        return self.batch.jobs[self.job][0]

    def key(self) -> dict[str, Any]:
        return {"batch_id": self.batch.batch_id, "job_id": self.job_id, "attempt_id": self.attempt_id}


class Ledger:
    """Expected usage (resource units x ms), kept independently of the SQL."""

    def __init__(self) -> None:
        self.by_job: dict[tuple[int, int, str], int] = defaultdict(int)
        self.by_group: dict[tuple[int, int, str], int] = defaultdict(int)
        self.by_project: dict[tuple[str, str], int] = defaultdict(int)
        self.by_day: dict[tuple[datetime.date, str, str, str], int] = defaultdict(int)

    def bill(self, attempt: Attempt, resources: list[str], delta_ms: int, rollup_ms: int) -> None:
        assert delta_ms >= 0
        b = attempt.batch
        job_id, group_id = b.jobs[attempt.job]
        for name in resources:
            usage = attempt.quantities[name] * delta_ms
            if usage == 0:
                continue
            self.by_job[(b.batch_id, job_id, name)] += usage
            for g in b.ancestors(group_id):
                self.by_group[(b.batch_id, g, name)] += usage
            self.by_project[(b.billing_project, name)] += usage
            self.by_day[(utc_day(rollup_ms), b.billing_project, b.user, name)] += usage

    # -- the documented effect of each operation on one attempt -----------

    def started(self, a: Attempt, start_ms: int) -> None:
        if a.start_ms is None and a.end_ms is None:
            a.start_ms = a.rollup_ms = start_ms

    def resources(self, a: Attempt, quantities: dict[str, int]) -> None:
        new = [name for name in quantities if name not in a.quantities]
        for name in new:
            a.quantities[name] = quantities[name]
        if a.start_ms is not None and a.rollup_ms is not None and a.rollup_ms > a.start_ms:
            self.bill(a, new, a.rollup_ms - a.start_ms, a.rollup_ms)

    def advance(self, a: Attempt, rollup_ms: int) -> None:
        if a.start_ms is None or a.rollup_ms is None or a.end_ms is not None or rollup_ms <= a.rollup_ms:
            return
        self.bill(a, list(a.quantities), rollup_ms - a.rollup_ms, rollup_ms)
        a.rollup_ms = rollup_ms

    def ended(self, a: Attempt, end_ms: int, start_ms: int | None = None) -> None:
        if a.end_ms is not None:
            return
        if a.start_ms is None and start_ms is not None:
            a.start_ms = a.rollup_ms = start_ms
        if a.start_ms is not None:
            self.advance(a, end_ms)
        a.end_ms = max(end_ms, a.start_ms or 0)

    def lost(self, a: Attempt, end_ms: int) -> None:
        """Its instance was deactivated: the attempt ends, billed up to its last rollup and no further
        (the time since, nobody reported it running)."""
        if a.end_ms is None:
            a.end_ms = max(end_ms, a.rollup_ms or a.start_ms or 0)


class Scenario:
    """Calls the procedures and keeps the ledger in step."""

    def __init__(self, world: World):
        self.world = world
        self.store = world.store
        self.ledger = Ledger()
        self.batches: list[Batch] = []

    def at(self, ms: int) -> None:
        assert ms >= self.world.clock.now_ms, "the scenario's clock only moves forward"
        self.world.clock.now_ms = ms

    async def submit(
        self,
        user: str,
        billing_project: str,
        groups: dict[str, str],
        jobs: list[tuple[str, str] | tuple[str, str, str]],
        into: Batch | None = None,
    ) -> Batch:
        """One update: `groups` maps a new group's name to its parent's name
        (parents first), `jobs` lists (name, group name[, parent job name])."""
        if into is None:
            created = await self.store.create_batch(user, billing_project)
            batch = Batch(int(created["batch_id"]), user, billing_project, {"root": 0}, {0: None}, {})
            self.batches.append(batch)
        else:
            batch = into
        update = await self.store.create_update(batch.batch_id, len(jobs), len(groups))
        update_id, start_job, start_group = (
            int(update["update_id"]), int(update["start_job_id"]), int(update["start_job_group_id"])
        )
        group_rows = []
        for i, (name, parent) in enumerate(groups.items()):
            group_id = start_group + i
            batch.group_ids[name] = group_id
            batch.parents[group_id] = batch.group_ids[parent]
            group_rows.append({"job_group_id": group_id, "parent_id": batch.group_ids[parent]})
        if group_rows:
            await self.store.insert_job_groups(batch.batch_id, update_id, group_rows)
        specs = []
        for i, (name, group, *parent) in enumerate(jobs):
            job_id = start_job + i
            batch.jobs[name] = (job_id, batch.group_ids[group])
            extra: dict[str, Any] = {"job_group_id": batch.group_ids[group], "cores_mcpu": 1000}
            if parent:
                extra["parents"] = [{"job_id": batch.jobs[parent[0]][0]}]
            specs.append(job_spec(job_id, **extra))
        # Two bunches in parallel: the update reserved their ids.
        half = len(specs) // 2
        await asyncio.gather(*(self.store.insert_jobs(batch.batch_id, update_id, bunch)
                               for bunch in (specs[:half], specs[half:]) if bunch))
        await self.store.commit_update(batch.batch_id, update_id)
        return batch

    async def schedule(self, batch: Batch, job: str, instance: str) -> Attempt:
        attempt = Attempt(batch, job, self.world.attempt_id(), instance)
        result = await self.store.schedule_jobs(self.world.epoch, instance, [attempt.key()])
        assert result[0]["outcome"] == "scheduled", result
        return attempt

    async def start(self, attempts: list[Attempt], start_ms: int) -> None:
        by_instance: dict[str, list[Attempt]] = defaultdict(list)
        for a in attempts:
            by_instance[a.instance].append(a)
        for instance, group in by_instance.items():
            await self.store.mark_jobs_started(
                self.world.epoch, instance, [{**a.key(), "start_time_ms": start_ms} for a in group]
            )
            for a in group:
                self.ledger.started(a, start_ms)

    async def resources(self, attempt: Attempt, **quantities: int) -> None:
        """cpu= mcpu, memory= MiB (local resources of 0002_local_defaults.sql)."""
        named = {f"{kind}/local/1": q for kind, q in quantities.items()}
        await self.store.add_attempt_resources(
            self.world.epoch, [{**attempt.key(), "resource": name, "quantity": q} for name, q in named.items()]
        )
        self.ledger.resources(attempt, named)

    async def heartbeat(self, instance: str, attempts: list[Attempt], rollup_ms: int) -> None:
        await self.store.heartbeat_rollup(
            self.world.epoch, instance, [{**a.key(), "rollup_time_ms": rollup_ms} for a in attempts]
        )
        for a in attempts:
            assert a.instance == instance
            self.ledger.advance(a, rollup_ms)

    async def deactivate(self, instance: str, open_attempts: list[Attempt]) -> None:
        status = await self.store.deactivate_instance(self.world.epoch, instance, "missed heartbeats")
        assert status["n_rescheduled"] == len(open_attempts)
        for a in open_attempts:
            assert a.instance == instance
            self.ledger.lost(a, self.world.clock.now_ms)

    async def complete(
        self, attempt: Attempt, state: str, end_ms: int, start_ms: int | None = None, expect: str = "completed"
    ) -> None:
        payload = {**attempt.key(), "state": state, "exit_code": 0 if state == "Success" else 1,
                   "start_time_ms": start_ms if start_ms is not None else attempt.start_ms, "end_time_ms": end_ms}
        result = await self.store.mark_jobs_complete(self.world.epoch, attempt.instance, [payload])
        assert result[0]["outcome"] == expect, result
        self.ledger.ended(attempt, end_ms, payload["start_time_ms"])


async def rates(world: World) -> dict[str, float]:
    rows = await world.db.fetchall("SELECT name, rate_usd FROM resources")
    found = {r["name"]: float(r["rate_usd"]) for r in rows}
    # The seeded prices: $0.04 per core-hour, $0.005 per GiB-hour (a DECIMAL
    # division in the migration once stored them as 0).
    assert found["cpu/local/1"] == pytest.approx(0.04 / (1000 * 3600000), rel=1e-12)
    assert found["memory/local/1"] == pytest.approx(0.005 / (1024 * 3600000), rel=1e-12)
    return found


def nonzero(d: dict[Any, int]) -> dict[Any, int]:
    return {k: v for k, v in d.items() if v}


def cost(usage: dict[Any, int], rate: dict[str, float], key_len: int) -> dict[Any, float]:
    """Dollars per key prefix (everything but the trailing resource name)."""
    out: dict[Any, float] = defaultdict(float)
    for key, u in usage.items():
        out[key[:key_len]] += u * rate[key[-1]]
    return dict(out)


async def run_scenario(world: World) -> Scenario:
    s = Scenario(world)
    await world.store.create_billing_project("proj2", ["alice", "bob"])
    for name in ("i1", "i2", "i3"):
        await world.instance(name)

    s.at(t(-45))
    b1 = await s.submit("alice", "proj", {"outer": "root", "inner": "outer"},
                        [("a", "root"), ("b", "outer"), ("c", "inner"), ("d", "inner", "c")])
    # A second update nests a third level under b1's inner group; its group
    # ids start after the first update's (create_update says where).
    await s.submit("alice", "proj", {"deep": "inner"}, [("e", "deep")], into=b1)
    assert b1.group_ids == {"root": 0, "outer": 1, "inner": 2, "deep": 3}
    b2 = await s.submit("bob", "proj2", {"outer": "root", "inner": "outer"}, [("k", "inner"), ("l", "outer")])
    b3 = await s.submit("bob", "proj", {}, [("x", "root"), ("y", "root")])
    b4 = await s.submit("alice", "proj2", {"only": "root"}, [("z", "only")])

    # -- day 1 -----------------------------------------------------------
    s.at(t(-40))
    a1 = await s.schedule(b1, "a", "i1")
    b1_1 = await s.schedule(b1, "b", "i1")
    k1 = await s.schedule(b2, "k", "i2")
    l1 = await s.schedule(b2, "l", "i2")
    x1 = await s.schedule(b3, "x", "i3")
    c1 = await s.schedule(b1, "c", "i3")
    # Resources known before the start bill nothing until time rolls up.
    await s.resources(a1, cpu=1000, memory=4096)
    await s.resources(k1, cpu=2000, memory=8192)
    await s.resources(l1, cpu=500)
    await s.resources(x1, cpu=1000, memory=2048)
    await s.resources(c1, cpu=250)
    await s.start([a1, b1_1, k1, l1, x1, c1], t(-40))

    s.at(t(-30))
    await s.heartbeat("i1", [a1, b1_1], t(-30))
    await s.heartbeat("i1", [a1, b1_1], t(-30))  # repeated: bills nothing more
    await s.heartbeat("i2", [k1, l1], t(-30))
    await s.heartbeat("i3", [x1, c1], t(-30))

    s.at(t(-25))
    # b's resources arrive after a rollup: the 10 minutes already rolled up
    # are billed at once, on the day of that rollup.
    await s.resources(b1_1, cpu=1500, memory=1024)
    # First write wins: a repeat with other quantities changes nothing.
    await s.resources(a1, cpu=9999, memory=1)

    s.at(t(-20))
    await s.heartbeat("i1", [a1, b1_1], t(-35))  # late, out of order: ignored
    await s.heartbeat("i3", [x1, c1], t(-20))

    s.at(t(-15))
    await s.complete(c1, "Success", t(-15))
    assert await world.state(b1.batch_id, b1.jobs["d"][0]) == "Ready"
    d1 = await s.schedule(b1, "d", "i3")
    await s.resources(d1, cpu=750)
    await s.start([d1], t(-15))
    y1 = await s.schedule(b3, "y", "i3")
    await s.resources(y1, cpu=300)

    # i1 is declared dead: its attempts end now, billed up to what its worker last reported (t-30),
    # and a, b go back to Ready.
    s.at(t(-10))
    await s.deactivate("i1", [a1, b1_1])
    assert await world.state(b1.batch_id, b1.jobs["a"][0]) == "Ready"
    assert await world.state(b1.batch_id, b1.jobs["b"][0]) == "Ready"

    s.at(t(-8))
    a2 = await s.schedule(b1, "a", "i2")
    b1_2 = await s.schedule(b1, "b", "i3")
    e1 = await s.schedule(b1, "e", "i2")
    await s.resources(a2, cpu=1000, memory=4096)
    await s.resources(e1, cpu=100, memory=1024)
    await s.start([a2, b1_2, e1], t(-8))

    # y: MJC before MJS, carrying the start time; the late MJS changes nothing.
    s.at(t(-5))
    await s.complete(y1, "Success", t(-6), start_ms=t(-12))
    s.at(t(-4))
    await s.start([y1], t(-12))
    # The dead worker's late heartbeat is refused and bills nothing.
    with pytest.raises(FailedPreconditionError):
        await s.heartbeat("i1", [a1, b1_1], t(-4))

    # -- day 2: these rollups advance across the midnight ------------------
    s.at(t(5))
    await s.heartbeat("i2", [k1, l1, a2, e1], t(5))
    await s.heartbeat("i3", [x1, d1, b1_2], t(5))

    s.at(t(6))
    await s.resources(b1_2, cpu=1500)  # 13 rolled-up minutes, billed on day 2
    z1 = await s.schedule(b4, "z", "i2")
    await s.start([z1], t(6))

    s.at(t(10))
    await s.complete(a2, "Success", t(10))
    await s.complete(a2, "Success", t(10), expect="already_complete")  # repeated MJC
    await s.heartbeat("i2", [a2], t(12))  # after the end: ignored
    await s.complete(k1, "Failed", t(10))
    await s.complete(x1, "Success", t(10))

    s.at(t(15))
    await s.heartbeat("i2", [l1, z1, e1], t(15))
    await s.resources(z1, cpu=1000)  # 9 rolled-up minutes at once

    s.at(t(20))
    for attempt in (l1, z1, e1, d1, b1_2):
        await s.complete(attempt, "Success", t(20))
    return s


async def test_aggregates_equal_cost_computed_from_attempts(world: World) -> None:
    s = await run_scenario(world)
    ledger = s.ledger
    rate = await rates(world)

    # Everything ran to completion, and every attempt is closed.
    for b in s.batches:
        assert (await world.batch_row(b.batch_id))["state"] == "complete"
    open_attempts = await world.db.fetchall("SELECT * FROM attempts WHERE end_time_ms IS NULL")
    assert open_attempts == []

    # One figure by hand, so the ledger itself is checked: job a ran on i1
    # from t-40, reported up to t-30 (the worker then fell silent and was
    # declared dead at t-10: those 20 minutes are not billed), and 18 minutes
    # on i2 (t-8 .. t+10).
    b1 = s.batches[0]
    a_id = b1.jobs["a"][0]
    assert ledger.by_job[(b1.batch_id, a_id, "cpu/local/1")] == 1000 * (10 + 18) * MIN_MS
    assert ledger.by_job[(b1.batch_id, a_id, "memory/local/1")] == 4096 * (10 + 18) * MIN_MS

    # Per job.
    rows = await world.db.fetchall(
        "SELECT a.batch_id, a.job_id, r.name, a.`usage` FROM aggregated_job_resources a "
        "JOIN resources r ON r.resource_id = a.resource_id"
    )
    assert nonzero({(r["batch_id"], r["job_id"], r["name"]): int(r["usage"]) for r in rows}) == nonzero(ledger.by_job)

    # Per job group, rolled up to every ancestor (summed over tokens).
    rows = await world.db.fetchall(
        "SELECT a.batch_id, a.job_group_id, r.name, SUM(a.`usage`) AS `usage`, "
        "       SUM(a.`usage` * r.rate_usd) AS cost_usd "
        "FROM aggregated_job_group_resources a JOIN resources r ON r.resource_id = a.resource_id "
        "GROUP BY a.batch_id, a.job_group_id, r.name"
    )
    by_group = {(r["batch_id"], r["job_group_id"], r["name"]): int(r["usage"]) for r in rows}
    assert nonzero(by_group) == nonzero(ledger.by_group)
    group_cost: dict[tuple[int, int], float] = defaultdict(float)
    for r in rows:
        group_cost[(r["batch_id"], r["job_group_id"])] += float(r["cost_usd"])
    expected_group_cost = cost(ledger.by_group, rate, 2)
    assert group_cost.keys() == expected_group_cost.keys()
    for key, dollars in expected_group_cost.items():
        assert group_cost[key] == pytest.approx(dollars, rel=1e-9), key
    # The nested groups of b1 really roll up: outer includes inner and deep.
    assert ledger.by_group[(b1.batch_id, 1, "cpu/local/1")] > ledger.by_group[(b1.batch_id, 2, "cpu/local/1")] > 0

    # Per batch: the batch_cost view (the root group).
    rows = await world.db.fetchall("SELECT batch_id, cost_usd FROM batch_cost")
    batch_cost = {r["batch_id"]: float(r["cost_usd"]) for r in rows}
    expected_batch_cost = {b: dollars for (b, g), dollars in expected_group_cost.items() if g == 0}
    assert batch_cost.keys() == {b.batch_id for b in s.batches} == expected_batch_cost.keys()
    for batch_id, dollars in expected_batch_cost.items():
        assert batch_cost[batch_id] == pytest.approx(dollars, rel=1e-9), batch_id
    # And the batch is the sum of its jobs.
    by_batch_from_jobs = cost(ledger.by_job, rate, 1)
    for batch_id, dollars in expected_batch_cost.items():
        assert by_batch_from_jobs[(batch_id,)] == pytest.approx(dollars, rel=1e-12)

    # Per billing project.
    rows = await world.db.fetchall(
        "SELECT a.billing_project, r.name, SUM(a.`usage`) AS `usage`, SUM(a.`usage` * r.rate_usd) AS cost_usd "
        "FROM aggregated_billing_project_resources a JOIN resources r ON r.resource_id = a.resource_id "
        "GROUP BY a.billing_project, r.name"
    )
    assert nonzero({(r["billing_project"], r["name"]): int(r["usage"]) for r in rows}) == nonzero(ledger.by_project)
    project_cost: dict[str, float] = defaultdict(float)
    for r in rows:
        project_cost[r["billing_project"]] += float(r["cost_usd"])
    expected_project_cost = cost(ledger.by_project, rate, 1)
    assert set(project_cost) == {"proj", "proj2"}
    for (project,), dollars in expected_project_cost.items():
        assert project_cost[project] == pytest.approx(dollars, rel=1e-9), project

    # Per billing project, user and UTC day.
    rows = await world.db.fetchall(
        "SELECT a.billing_date, a.billing_project, a.user, r.name, SUM(a.`usage`) AS `usage`, "
        "       SUM(a.`usage` * r.rate_usd) AS cost_usd "
        "FROM aggregated_billing_project_user_resources_by_date a JOIN resources r ON r.resource_id = a.resource_id "
        "GROUP BY a.billing_date, a.billing_project, a.user, r.name"
    )
    by_day = {(r["billing_date"], r["billing_project"], r["user"], r["name"]): int(r["usage"]) for r in rows}
    assert nonzero(by_day) == nonzero(ledger.by_day)
    day_cost: dict[tuple[datetime.date, str, str], float] = defaultdict(float)
    for r in rows:
        day_cost[(r["billing_date"], r["billing_project"], r["user"])] += float(r["cost_usd"])
    expected_day_cost = cost(ledger.by_day, rate, 3)
    assert day_cost.keys() == expected_day_cost.keys()
    for key, dollars in expected_day_cost.items():
        assert day_cost[key] == pytest.approx(dollars, rel=1e-9), key
    # The midnight really split the days, for every project and user.
    assert {(d, p, u) for (d, p, u) in expected_day_cost} == {
        (d, p, u) for d in (DAY_1, DAY_2) for (p, u) in (("proj", "alice"), ("proj", "bob"), ("proj2", "bob"))
    } | {(DAY_2, "proj2", "alice")}
    # Days partition the project's total.
    for project, dollars in project_cost.items():
        assert sum(c for (d, p, u), c in day_cost.items() if p == project) == pytest.approx(dollars, rel=1e-9)

    assert await check_invariants(world.db) == []


# -- refusals ----------------------------------------------------------------


BILLING_TABLES = (
    "attempts", "attempt_resources", "aggregated_job_resources", "aggregated_job_group_resources",
    "aggregated_billing_project_resources", "aggregated_billing_project_user_resources_by_date",
)
STATE_TABLES = BILLING_TABLES + (
    "jobs", "instances", "batches", "job_groups", "job_groups_n_jobs_in_complete_states",
    "user_inst_coll_resources_by_job_group", "batch_completions",
)


async def snapshot(world: World, tables: tuple[str, ...]) -> dict[str, list[dict[str, Any]]]:
    return {table: await world.db.fetchall(f"SELECT * FROM {table} ORDER BY 1, 2, 3") for table in tables}


async def _one_running_attempt(world: World) -> tuple[int, int, str]:
    """A job running on i1 since t-10 with cpu recorded and 5 minutes rolled up."""
    await world.instance()
    world.clock.now_ms = t(-10)
    batch_id, _, job_id = await world.batch([{}])
    attempt = await world.run(batch_id, job_id)
    await world.store.add_attempt_resources(
        world.epoch, [{"batch_id": batch_id, "job_id": job_id, "attempt_id": attempt,
                       "resource": "cpu/local/1", "quantity": 1000}]
    )
    world.clock.now_ms = t(-5)
    await world.store.heartbeat_rollup(
        world.epoch, "i1", [{"batch_id": batch_id, "job_id": job_id, "attempt_id": attempt, "rollup_time_ms": t(-5)}]
    )
    return batch_id, job_id, attempt


@pytest.mark.parametrize(
    "bad",
    [
        {"resource": "gpu/local/1", "quantity": 1},
        {"resource": "cpu/local/1", "quantity": -1},
        {"resource": "memory/local/1"},
    ],
    ids=["unknown_resource", "negative_quantity", "missing_quantity"],
)
async def test_bad_resource_is_refused_and_writes_nothing(world: World, bad: dict[str, Any]) -> None:
    batch_id, job_id, attempt = await _one_running_attempt(world)
    key = {"batch_id": batch_id, "job_id": job_id, "attempt_id": attempt}
    before = await snapshot(world, BILLING_TABLES)
    with pytest.raises(InvalidArgumentError):
        # The good entry in the same call is not written either.
        await world.store.add_attempt_resources(
            world.epoch, [{**key, "resource": "storage/local/1", "quantity": 10}, {**key, **bad}]
        )
    assert await snapshot(world, BILLING_TABLES) == before
    assert await check_invariants(world.db) == []


async def test_stale_epoch_is_refused_and_writes_nothing(world: World) -> None:
    batch_id, job_id, attempt = await _one_running_attempt(world)
    key = {"batch_id": batch_id, "job_id": job_id, "attempt_id": attempt}
    world.epoch = await world.store.elect_leader("driver-1")
    stale = world.epoch - 1
    world.clock.now_ms = t(5)
    before = await snapshot(world, STATE_TABLES)

    with pytest.raises(StaleEpochError):
        await world.store.heartbeat_rollup(stale, "i1", [{**key, "rollup_time_ms": t(5)}])
    with pytest.raises(StaleEpochError):
        await world.store.add_attempt_resources(stale, [{**key, "resource": "memory/local/1", "quantity": 2048}])
    with pytest.raises(StaleEpochError):
        await world.store.mark_jobs_complete(
            stale, "i1", [{**key, "state": "Success", "exit_code": 0, "start_time_ms": t(-10), "end_time_ms": t(5)}]
        )
    assert await snapshot(world, STATE_TABLES) == before

    # The same calls with the current epoch go through.
    await world.store.heartbeat_rollup(world.epoch, "i1", [{**key, "rollup_time_ms": t(5)}])
    await world.store.add_attempt_resources(world.epoch, [{**key, "resource": "memory/local/1", "quantity": 2048}])
    outcome = await world.store.mark_jobs_complete(
        world.epoch, "i1", [{**key, "state": "Success", "exit_code": 0, "start_time_ms": t(-10), "end_time_ms": t(5)}]
    )
    assert outcome[0]["outcome"] == "completed"
    usage = await world.db.fetchall(
        "SELECT r.name, a.`usage` FROM aggregated_job_resources a JOIN resources r USING (resource_id) "
        "WHERE a.batch_id = %s AND a.job_id = %s", (batch_id, job_id)
    )
    assert {u["name"]: int(u["usage"]) for u in usage} == {
        "cpu/local/1": 1000 * 15 * MIN_MS, "memory/local/1": 2048 * 15 * MIN_MS,
    }
    assert await check_invariants(world.db) == []


# -- late reports after a completion that carried no start time -------------


async def _cancelled_before_started(world: World) -> dict[str, Any]:
    """SJ at t-10 with cpu recorded; the canceller's MJC (no start time, the
    driver never heard MJS) closes the attempt at t-5."""
    await world.instance()
    world.clock.now_ms = t(-10)
    batch_id, _, job_id = await world.batch([{}])
    key = {"batch_id": batch_id, "job_id": job_id, "attempt_id": world.attempt_id()}
    assert (await world.store.schedule_jobs(world.epoch, "i1", [key]))[0]["outcome"] == "scheduled"
    await world.store.add_attempt_resources(world.epoch, [{**key, "resource": "cpu/local/1", "quantity": 1000}])
    world.clock.now_ms = t(-5)
    outcome = await world.store.mark_jobs_complete(world.epoch, "i1", [{**key, "state": "Cancelled"}])
    assert outcome[0]["outcome"] == "completed"
    world.clock.now_ms = t(-2)
    return key


@pytest.mark.parametrize("start_minutes", [-8, -3], ids=["started_before_the_end", "started_after_the_end"])
async def test_late_mark_started_after_completion_changes_nothing(world: World, start_minutes: int) -> None:
    """mark_jobs_started.sql: "a late call after MJC ... changes nothing".
    The worker had started the container (before, or with clock skew after,
    the time the canceller recorded) and its MJS arrives late."""
    key = await _cancelled_before_started(world)
    before = await snapshot(world, BILLING_TABLES)
    status = await world.store.mark_jobs_started(world.epoch, "i1", [{**key, "start_time_ms": t(start_minutes)}])
    assert status["n_started"] == 0
    assert await snapshot(world, BILLING_TABLES) == before
    assert await check_invariants(world.db) == []


async def test_late_completion_with_a_start_after_the_recorded_end_is_accepted(world: World) -> None:
    """The worker's own MJC follows the canceller's: 'already_complete', and
    recording its times must not break the attempts_times constraint (which
    would fail the whole bulk call, for every job in it, on every retry)."""
    key = await _cancelled_before_started(world)
    other_batch, _, other_job = await world.batch([{}])
    other = {"batch_id": other_batch, "job_id": other_job, "attempt_id": await world.run(other_batch, other_job)}
    outcome = await world.store.mark_jobs_complete(
        world.epoch, "i1",
        [{**key, "state": "Success", "exit_code": 0, "start_time_ms": t(-3), "end_time_ms": t(-1)},
         {**other, "state": "Success", "exit_code": 0, "end_time_ms": t(-1)}],
    )
    assert {(r["job_id"], r["outcome"]) for r in outcome} == {
        (key["job_id"], "already_complete"), (other_job, "completed"),
    }
    assert await check_invariants(world.db) == []
