"""The planner's promises, on generated snapshots (hypothesis):

- no worker is given more cores, memory or scratch storage than it has
  free (storage less its open attempts' reservations), and every job
  lands in one of its regions; a job that must run on demand never lands on
  a preemptible worker, a job avoiding a worker never lands there while the
  pool has another, and no job is placed before its retry back-off passed;
- no two placed jobs, and no placed job and a running one, of one billing
  project hold clashing locks;
- every candidate is placed or says why it waits, never both;
- a job's reason is the first rule that stopped it (each earlier rule can be
  shown not to have applied);
- fair share: no user is given more cores than their water-filled share (weighted: a user's weight is their
  quota's times their queue head's project's), and users are served in weighted fair-share order;
- quotas: no project's or user's running cores or jobs, counted across pools, pass their caps once the
  cycle's placements are added (unless nothing of theirs is placed), and a QUOTA_REACHED job names the quota;
- budgets: a job's worst case is the one it is given (the database prices
  it), never one the planner works out from its size;
- the same snapshot gives the same plan;
- images: preferring a worker that holds a job's image changes where jobs go, never which start or why the
  others wait, and with room everywhere each job whose image an eligible worker holds goes to one.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from services.policy import planner
from services.policy.fair_share import UserDemand, fair_share_order
from services.policy.lock_contention import LockInterest, LockMode, LockRequest, conflicts, locks_from_rows
from services.policy.planner import POOL_PAUSED, Budget, Candidate, Quota, Snapshot, Usage, Worker, plan
from tests.examples import examples

USERS = ("ann", "bob", "cat")
PROJECTS = ("p1", "p2")
LEVELS = ("disk", "net", "*")
NAMES = ("x", "y")
GIB = 1 << 30


@st.composite
def lock_requests(draw: st.DrawFn) -> dict[str, LockRequest]:
    locks = {}
    for level in draw(st.lists(st.sampled_from(LEVELS), max_size=2, unique=True)):
        if level == "*":
            locks[level] = LockRequest(LockMode.ALL_EXCLUSIVE)
            continue
        mode = draw(st.sampled_from([m for m in LockMode if m is not LockMode.NONE]))
        names = frozenset(draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=2, unique=True))) \
            if mode.named else frozenset()
        locks[level] = LockRequest(mode, names)
    return locks


@st.composite
def snapshots(draw: st.DrawFn) -> Snapshot:
    sizes = st.one_of(st.none(), st.integers(0, 32).map(lambda g: g * GIB // 2))
    workers = [Worker(f"w{i}", draw(st.integers(0, 2)), draw(st.integers(0, 16)) * 500, draw(sizes), draw(st.booleans()),
                      free_storage_bytes=draw(sizes))
               for i in range(draw(st.integers(0, 5)))]
    queues: dict[str, list[Candidate]] = {}
    next_job = 1
    for user in draw(st.lists(st.sampled_from(USERS), max_size=3, unique=True)):
        queue = []
        for _ in range(draw(st.integers(1, 8))):
            queue.append(Candidate(
                (1 + USERS.index(user), next_job), user, draw(st.sampled_from(PROJECTS)),
                draw(st.integers(1, 16)) * 250, draw(st.integers(0, 8)) * GIB // 2,
                draw(st.one_of(st.none(), st.integers(1, 7))), draw(st.integers(0, 2)),
                draw(st.integers(0, 1200)), draw(lock_requests()),
                draw(st.sampled_from([0, 0, 1, 500_000, 2_000_000, 7_000_000])),
                on_demand=draw(st.booleans()), avoid_worker=draw(st.sampled_from([None, None, "w0", "w1"])),
                not_before_s=draw(st.sampled_from([None, None, 1000.0, 1200.0, 1300.0])),
                storage_bytes=draw(st.integers(0, 8)) * GIB // 2))
            next_job += 1
        queue.sort(key=lambda c: (-c.priority, c.key))  # the read's order
        queues[user] = queue
    demands = [UserDemand(u, draw(st.integers(0, 8)) * 1000, sum(c.cores_mcpu for c in q) + draw(st.integers(0, 4000)))
               for u, q in queues.items()]
    held = {p: {(9, i): draw(lock_requests()) for i in range(draw(st.integers(0, 2)))} for p in PROJECTS}
    budgets = {p: Budget(draw(st.sampled_from(["open", "open", "closed"])),
                         draw(st.one_of(st.none(), st.floats(0, 10))), draw(st.floats(0, 10)),
                         draw(st.sampled_from([0, 0, 1_000_000, 3_000_000])))
               for p in PROJECTS}
    quotas, usage = {}, {}
    for key in [("project", p) for p in PROJECTS] + [("user", u) for u in USERS]:
        if draw(st.booleans()):
            quotas[key] = Quota(draw(st.one_of(st.none(), st.integers(0, 16).map(lambda n: n * 500))),
                                draw(st.one_of(st.none(), st.integers(0, 6))), draw(st.integers(1, 3)), "admin")
            usage[key] = Usage(draw(st.integers(0, 8)) * 500, draw(st.integers(0, 4)))
    return Snapshot("standard", workers, demands, queues, held, budgets,
                    jobs_per_cycle=draw(st.integers(1, 12)), now_s=1200.0, quotas=quotas, usage=usage)


def _quota_passed(snapshot: Snapshot, job: Candidate, placed: dict[tuple[str, str], Usage]) -> bool:
    """Whether `job` would pass a cap of its project's or user's quota with `placed` started by the cycle."""
    for key in (("project", job.billing_project), ("user", job.user)):
        quota = snapshot.quotas.get(key)
        if quota is None:
            continue
        now, more = snapshot.usage.get(key, Usage()), placed.get(key, Usage())
        if quota.max_running_cores_mcpu is not None and \
                now.cores_mcpu + more.cores_mcpu + job.cores_mcpu > quota.max_running_cores_mcpu:
            return True
        if quota.max_running_jobs is not None and now.jobs + more.jobs + 1 > quota.max_running_jobs:
            return True
    return False


def _budget_stops(snapshot: Snapshot, job: Candidate, placed_micro_usd: int) -> bool:
    """Whether the billing rule stops `job` with `placed_micro_usd` already reserved by the cycle."""
    budget = snapshot.budgets.get(job.billing_project)
    return budget is not None and (budget.state != "open" or (budget.limit_usd is not None and (
        planner.limit_reached(budget.spend_usd, budget.limit_usd)
        or job.reserve_micro_usd > budget.left_micro_usd() - placed_micro_usd)))


def _clashes(a: dict[str, LockRequest], b: dict[str, LockRequest]) -> bool:
    return conflicts(a, {level: [r] for level, r in b.items()})


@settings(max_examples=examples(2000), deadline=None)
@given(snapshots())
def test_the_plan_keeps_every_promise(snapshot: Snapshot) -> None:
    _keeps_every_promise(snapshot)


def _keeps_every_promise(snapshot: Snapshot) -> None:
    result = plan(snapshot)
    jobs = {c.key: c for queue in snapshot.queues.values() for c in queue}
    workers = {w.name: w for w in snapshot.workers}
    placed = {p.key: p for p in result.placements}
    assert len(placed) == len(result.placements)

    # Every candidate placed or waiting, never both.
    assert set(placed) | set(result.waits) == set(jobs)
    assert not set(placed) & set(result.waits)

    # Room and regions.
    cores, memory, storage = defaultdict(int), defaultdict(int), defaultdict(int)
    for p in result.placements:
        job, worker = jobs[p.key], workers[p.worker]
        assert p.cores_mcpu == job.cores_mcpu
        assert job.regions_bits is None or (job.regions_bits >> worker.region_id) & 1
        cores[p.worker] += job.cores_mcpu
        memory[p.worker] += job.memory_bytes
        storage[p.worker] += job.storage_bytes
        assert not (job.on_demand and worker.preemptible)
        assert p.worker != job.avoid_worker or len(workers) == 1
        assert job.not_before_s is None or job.not_before_s <= snapshot.now_s
    for name, worker in workers.items():
        assert cores[name] <= worker.free_cores_mcpu
        assert worker.free_memory_bytes is None or memory[name] <= worker.free_memory_bytes
        assert worker.free_storage_bytes is None or storage[name] <= worker.free_storage_bytes

    # Locks: placed against running and against each other, per project.
    for p in result.placements:
        job = jobs[p.key]
        assert not any(_clashes(job.locks, held) for held in snapshot.held.get(job.billing_project, {}).values())
        for q in result.placements:
            other = jobs[q.key]
            if q.key != p.key and other.billing_project == job.billing_project:
                assert not _clashes(job.locks, other.locks)

    # Budgets: what the cycle reserves never passes what a project's limit leaves.
    placed_cost = defaultdict(int)
    for p in result.placements:
        placed_cost[jobs[p.key].billing_project] += jobs[p.key].reserve_micro_usd
    for project, cost in placed_cost.items():
        budget = snapshot.budgets.get(project)
        if budget is not None and budget.limit_usd is not None:
            assert cost <= budget.left_micro_usd()
        assert budget is None or budget.state == "open"

    # Quotas: what runs plus what the cycle starts stays within every cap of a project or user it starts for.
    placed_usage: dict[tuple[str, str], Usage] = {}
    for p in result.placements:
        job = jobs[p.key]
        for key in (("project", job.billing_project), ("user", job.user)):
            was = placed_usage.get(key, Usage())
            placed_usage[key] = Usage(was.cores_mcpu + job.cores_mcpu, was.jobs + 1)
    for key, more in placed_usage.items():
        quota, now = snapshot.quotas.get(key), snapshot.usage.get(key, Usage())
        if quota is not None:
            assert quota.max_running_cores_mcpu is None or \
                now.cores_mcpu + more.cores_mcpu <= quota.max_running_cores_mcpu
            assert quota.max_running_jobs is None or now.jobs + more.jobs <= quota.max_running_jobs

    # Fair share: nobody beyond their water-filled share, users served in weighted order.
    weighted = planner.weighted(snapshot)
    assert {d.user: d.weight for d in weighted} == {
        d.user: planner.user_weight(d.user, snapshot.queues.get(d.user, ()), snapshot.quotas) for d in snapshot.demands}
    order = fair_share_order(weighted)
    first_placed = [jobs[p.key].user for p in result.placements]
    assert first_placed == sorted(first_placed, key=order.index)
    given_cores = defaultdict(int)
    for p in result.placements:
        given_cores[jobs[p.key].user] += p.cores_mcpu
    for user, n in given_cores.items():
        assert n <= result.allocation[user]

    # Each reason is the first rule that stopped the job: the earlier rules did not apply.
    free_after = {name: (w.free_cores_mcpu - cores[name],
                         None if w.free_memory_bytes is None else w.free_memory_bytes - memory[name],
                         None if w.free_storage_bytes is None else w.free_storage_bytes - storage[name])
                  for name, w in workers.items()}
    for key, wait in result.waits.items():
        job = jobs[key]
        if wait.code == planner.QUEUED_BEHIND_OWN_JOBS:
            continue
        assert wait.code in planner.RULES
        earlier = planner.RULES[:planner.RULES.index(wait.code)]
        if planner.RETRY_DELAY in earlier:
            assert job.not_before_s is None or job.not_before_s <= snapshot.now_s
        if wait.code == planner.RETRY_DELAY:
            assert job.not_before_s > snapshot.now_s
        if planner.BILLING_LIMIT_REACHED in earlier:  # it fit before the cycle placed anything
            assert not _budget_stops(snapshot, job, 0), wait
        if wait.code == planner.BILLING_LIMIT_REACHED:  # it did not fit once the cycle placed what it did
            assert _budget_stops(snapshot, job, placed_cost[job.billing_project])
            if "may cost up to" in wait.detail:  # the worst case it names is the one it was given
                assert f"may cost up to ${job.reserve_micro_usd / 1000000:.6f} " in wait.detail
            assert (key in result.never_fit) == (
                snapshot.budgets[job.billing_project].state == "open" and
                job.reserve_micro_usd > snapshot.budgets[job.billing_project].limit_usd * 1000000
                - snapshot.budgets[job.billing_project].spend_usd * 1000000)
        if planner.QUOTA_REACHED in earlier:  # it fit its quotas before the cycle placed anything
            assert not _quota_passed(snapshot, job, {}), wait
        if wait.code == planner.QUOTA_REACHED:  # and not once the cycle placed what it did
            assert _quota_passed(snapshot, job, placed_usage)
            assert f"the quota of billing project {job.billing_project} " in wait.detail or \
                f"the quota of user {job.user} " in wait.detail
        if planner.BLOCKED_BY_LOCK in earlier:  # nothing running clashes (what was placed before may not)
            assert not any(_clashes(job.locks, h) for h in snapshot.held.get(job.billing_project, {}).values())
        if wait.code == planner.BLOCKED_BY_LOCK:
            holders = {**snapshot.held.get(job.billing_project, {}),
                       **{k: jobs[k].locks for k in placed if jobs[k].billing_project == job.billing_project}}
            assert wait.holders and all(_clashes({wait.level: job.locks[wait.level]}, holders[h])
                                        for h in wait.holders)
        if wait.code == planner.NO_CAPACITY_IN_REGIONS:
            for name, (c, m, s) in free_after.items():
                allowed = (job.regions_bits is None or (job.regions_bits >> workers[name].region_id) & 1) \
                    and not (job.on_demand and workers[name].preemptible) \
                    and (name != job.avoid_worker or len(workers) == 1)
                assert not (allowed and c >= job.cores_mcpu and (m is None or m >= job.memory_bytes)
                            and (s is None or s >= job.storage_bytes))
        if wait.code == planner.OVER_FAIR_SHARE and job.user in result.allocation:
            assert given_cores[job.user] + job.cores_mcpu > result.allocation[job.user]

    # Deterministic.
    assert plan(snapshot) == result


def test_a_job_too_big_for_its_share_is_skipped_not_a_barrier() -> None:
    big = Candidate((1, 1), "ann", "p1", 4000)
    small = Candidate((1, 2), "ann", "p1", 1000)
    snapshot = Snapshot("standard", [Worker("w0", 0, 8000)], [UserDemand("ann", 0, 5000), UserDemand("bob", 0, 4000)],
                        {"ann": [big, small], "bob": [Candidate((2, 1), "bob", "p1", 4000)]}, jobs_per_cycle=10)
    result = plan(snapshot)
    assert result.allocation == {"ann": 4000, "bob": 4000}
    assert {p.key for p in result.placements} == {(1, 1), (2, 1)}
    assert result.waits[(1, 2)].code == planner.OVER_FAIR_SHARE


def test_two_exclusive_holders_of_one_name_never_start_together_and_readers_share() -> None:
    writer = {"disk": LockRequest(LockMode.EXCLUSIVE, frozenset({"x"}))}
    reader = {"disk": LockRequest(LockMode.SHARED, frozenset({"x"}))}
    queue = [Candidate((1, 1), "ann", "p1", 1000, locks=writer), Candidate((1, 2), "ann", "p1", 1000, locks=writer),
             Candidate((1, 3), "ann", "p2", 1000, locks=writer)]
    snapshot = Snapshot("standard", [Worker("w0", 0, 8000)], [UserDemand("ann", 0, 3000)], {"ann": queue},
                        jobs_per_cycle=10)
    result = plan(snapshot)
    assert {p.key for p in result.placements} == {(1, 1), (1, 3)}  # another project's lock of the same name
    assert (result.waits[(1, 2)].code, result.waits[(1, 2)].holders) == (planner.BLOCKED_BY_LOCK, ((1, 1),))

    readers = [Candidate((1, i), "ann", "p1", 1000, locks=reader) for i in range(1, 4)]
    result = plan(Snapshot("standard", [Worker("w0", 0, 8000)], [UserDemand("ann", 0, 3000)], {"ann": readers},
                           jobs_per_cycle=10))
    assert len(result.placements) == 3
    held = {"p1": {(7, 7): writer}}
    result = plan(Snapshot("standard", [Worker("w0", 0, 8000)], [UserDemand("ann", 0, 3000)], {"ann": readers},
                           held, jobs_per_cycle=10))
    assert not result.placements and {w.holders for w in result.waits.values()} == {((7, 7),)}


def test_no_capacity_comes_before_fair_share_and_the_queue_beyond_the_look_waits_behind() -> None:
    queue = [Candidate((1, i), "ann", "p1", 2000, memory_bytes=8 * GIB) for i in range(1, 5)]
    snapshot = Snapshot("standard", [Worker("w0", 0, 8000, 4 * GIB)], [UserDemand("ann", 0, 8000)], {"ann": queue},
                        jobs_per_cycle=2)
    result = plan(snapshot)
    assert not result.placements
    assert [result.waits[c.key].code for c in queue] == [planner.NO_CAPACITY_IN_REGIONS] * 2 + \
        [planner.QUEUED_BEHIND_OWN_JOBS] * 2


def test_reservations_fill_a_budget_and_no_further() -> None:
    queue = [Candidate((1, i), "ann", "p1", 1000, reserve_micro_usd=400_000) for i in range(1, 6)]
    budgets = {"p1": Budget("open", 2.0, 0.5, 300_000)}  # $1.2 left: three jobs of $0.4
    result = plan(Snapshot("standard", [Worker("w0", 0, 8000)], [UserDemand("ann", 0, 5000)], {"ann": queue},
                           budgets=budgets, jobs_per_cycle=10))
    assert [p.key for p in result.placements] == [(1, 1), (1, 2), (1, 3)]
    assert {result.waits[(1, i)].code for i in (4, 5)} == {planner.BILLING_LIMIT_REACHED}
    assert not result.never_fit
    too_big = Candidate((2, 1), "ann", "p1", 1000, reserve_micro_usd=1_600_000)
    result = plan(Snapshot("standard", [Worker("w0", 0, 8000)], [UserDemand("ann", 0, 1000)], {"ann": [too_big]},
                           budgets=budgets, jobs_per_cycle=10))
    assert result.never_fit == ((2, 1),) and "can never run" in result.waits[(2, 1)].detail


def _priced(snapshot: Snapshot, reserve_micro_usd: int) -> Snapshot:
    """`snapshot` with every candidate given this worst case, whatever its cores, memory and storage, and every
    project open with $4 of its $5 limit left."""
    return dataclasses.replace(snapshot, budgets={p: Budget("open", 5.0, 1.0, 0) for p in PROJECTS}, queues={
        user: [dataclasses.replace(c, reserve_micro_usd=reserve_micro_usd) for c in queue]
        for user, queue in snapshot.queues.items()})


@settings(max_examples=examples(500), deadline=None)
@given(snapshots())
def test_the_planner_takes_the_worst_case_it_is_given(snapshot: Snapshot) -> None:
    """The planner prices no job itself (the database does: job_worst_case_micro_usd): given nothing to
    reserve, no job waits for money, however big it is; given more than the limit, every job the cycle looks
    at (past its retry back-off) can never run, and says what it was given."""
    snapshot = dataclasses.replace(snapshot, quotas={}, usage={})  # quotas change which jobs are looked at
    free = plan(_priced(snapshot, 0))
    assert free.never_fit == ()
    assert planner.BILLING_LIMIT_REACHED not in {w.code for w in free.waits.values()}
    dear = plan(_priced(snapshot, 5_000_001))
    depth = planner.depths(snapshot.workers, snapshot.demands, snapshot.jobs_per_cycle)
    looked_at = [c for user, queue in snapshot.queues.items() for c in queue[:depth.get(user, 0)]
                 if c.not_before_s is None or c.not_before_s <= snapshot.now_s]
    assert set(dear.never_fit) == {c.key for c in looked_at}
    assert dear.placements == ()
    for c in looked_at:
        assert "can never run" in dear.waits[c.key].detail and "may cost up to $5.000001 " in dear.waits[c.key].detail


def test_the_given_worst_case_decides_not_the_jobs_size() -> None:
    """Two jobs alike in cores and memory, priced differently by the database: the one whose given worst
    case fits starts, the other waits, named by its own price."""
    cheap = Candidate((1, 1), "ann", "p1", 1000, 2 * GIB, reserve_micro_usd=100_000)
    dear = Candidate((1, 2), "ann", "p1", 1000, 2 * GIB, reserve_micro_usd=900_000)
    budgets = {"p1": Budget("open", 1.0, 0.0, 500_000)}  # $0.5 left
    result = plan(Snapshot("standard", [Worker("w0", 0, 8000)], [UserDemand("ann", 0, 2000)], {"ann": [dear, cheap]},
                           budgets=budgets, jobs_per_cycle=10))
    assert [p.key for p in result.placements] == [(1, 1)]
    assert result.waits[(1, 2)].code == planner.BILLING_LIMIT_REACHED
    assert "may cost up to $0.900000 " in result.waits[(1, 2)].detail
    assert result.never_fit == ()


def test_a_project_at_its_limit_or_closed_starts_nothing() -> None:
    queue = [Candidate((1, 1), "ann", "p1", 1000), Candidate((1, 2), "ann", "p2", 1000)]
    budgets = {"p1": Budget("open", 0.0, 0.0), "p2": Budget("closed")}
    result = plan(Snapshot("standard", [Worker("w0", 0, 8000)], [UserDemand("ann", 0, 2000)], {"ann": queue},
                           budgets=budgets, jobs_per_cycle=10))
    assert not result.placements
    assert {w.code for w in result.waits.values()} == {planner.BILLING_LIMIT_REACHED}


def _summarised(held: dict[str, dict[object, dict[str, LockRequest]]], interest: LockInterest
                ) -> dict[str, dict[object, dict[str, LockRequest]]]:
    """The held locks as the held_locks summary gives them: one `HeldLock` per (level, mode, name), only
    those `interest` covers."""
    counted: dict[str, dict[planner.HeldLock, int]] = defaultdict(lambda: defaultdict(int))
    for project, jobs in held.items():
        for locks in jobs.values():
            for level, request in locks.items():
                for name in sorted(request.names) or [""]:
                    if interest.covers(level, name):
                        counted[project][planner.HeldLock(level, request.mode.value, name, 0)] += 1
    return {project: {dataclasses.replace(h, n_holders=n): locks_from_rows([(h.level, h.mode, h.name)])
                      for h, n in by_lock.items()}
            for project, by_lock in counted.items()}


@settings(max_examples=examples(400))
@given(snapshots(), st.lists(lock_requests(), max_size=4), st.lists(st.sampled_from(PROJECTS), max_size=4))
def test_the_counted_held_locks_the_candidates_can_meet_decide_as_every_holder(
        snapshot: Snapshot, more_held: list[dict[str, LockRequest]], more_projects: list[str]) -> None:
    """What the scheduler reads (held_locks: counted per distinct lock, only what `LockInterest` says the
    candidates can meet) gives the plan that every holder's own locks give: the same placements, and the
    same reason for every other job. Held names no candidate asks for (z) are among them."""
    held = {p: dict(jobs) for p, jobs in snapshot.held.items()}
    for i, (locks, project) in enumerate(zip(more_held, more_projects)):
        renamed = {level: LockRequest(r.mode, frozenset({"z"}) if r.names else r.names)
                   for level, r in locks.items()}
        held.setdefault(project, {})[(8, i)] = renamed
    # Room and money for everyone, so that the locks decide.
    snapshot = dataclasses.replace(snapshot, workers=[Worker("w0", 0, 1_000_000, None, False)], budgets={})
    every = dataclasses.replace(snapshot, held=held)
    interest = LockInterest.of(c.locks for queue in snapshot.queues.values() for c in queue if c.locks)
    counted = dataclasses.replace(snapshot, held=_summarised(held, interest))
    by_job, by_lock = plan(every), plan(counted)
    assert by_job.placements == by_lock.placements
    assert {k: w.code for k, w in by_job.waits.items()} == {k: w.code for k, w in by_lock.waits.items()}
    assert by_job.never_fit == by_lock.never_fit


def test_counted_holds_the_candidates_meet_by_level_or_by_name_still_block() -> None:
    """The cases a narrower `LockInterest` would miss: a level-wide hold where a job asks for a name, and
    a held name where a job asks for the whole level."""
    for wants, holds in (({"disk": LockRequest(LockMode.EXCLUSIVE, frozenset({"x"}))},
                          {"disk": LockRequest(LockMode.UNKNOWN_EXCLUSIVE)}),
                         ({"disk": LockRequest(LockMode.ALL_SHARED)},
                          {"disk": LockRequest(LockMode.EXCLUSIVE, frozenset({"z"}))})):
        job = Candidate((1, 1), "ann", "p1", 250, 0, None, 0, 0, wants, 0)
        held = {"p1": {(9, 0): holds}}
        snapshot = Snapshot("standard", [Worker("w0", 0, 1_000_000, None, False)], [UserDemand("ann", 0, 250)],
                            {"ann": [job]}, _summarised(held, LockInterest.of([wants])), {}, 10, 1200.0)
        result = plan(snapshot)
        assert not result.placements and result.waits[(1, 1)].code == planner.BLOCKED_BY_LOCK
        assert "held by 1 running job(s)" in result.waits[(1, 1)].detail


def test_a_job_goes_only_where_its_storage_is_free_and_its_wait_says_storage() -> None:
    # w0 has the cores and memory but 4 GiB of storage left after its open attempts; w1 says nothing of its
    # storage (not checked there) but is a spot machine; the job must run on demand.
    workers = [Worker("w0", 0, 8000, 16 * GIB, free_storage_bytes=4 * GIB),
               Worker("w1", 0, 8000, 16 * GIB, preemptible=True)]
    big = Candidate((1, 1), "ann", "p1", 1000, GIB, storage_bytes=6 * GIB, on_demand=True)
    small = Candidate((1, 2), "ann", "p1", 1000, GIB, storage_bytes=3 * GIB)
    second = Candidate((1, 3), "ann", "p1", 1000, GIB, storage_bytes=3 * GIB, on_demand=True)
    result = plan(Snapshot("standard", workers, [UserDemand("ann", 0, 3000)], {"ann": [big, small, second]},
                           jobs_per_cycle=10))
    assert [(p.key, p.worker) for p in result.placements] == [((1, 2), "w0")]
    assert {key: w.code for key, w in result.waits.items()} == {
        (1, 1): planner.NO_CAPACITY_IN_REGIONS, (1, 3): planner.NO_CAPACITY_IN_REGIONS}
    assert "has 1 cores, 1 GiB of memory and 6 GiB of scratch storage free" in result.waits[(1, 1)].detail
    assert "3 GiB of scratch storage" in result.waits[(1, 3)].detail  # w0's last 1 GiB went to the small job


IMAGES = ("docker.io/library/python:3.11", "localhost/lab/tool:1", "sha256:feed")


@st.composite
def warm_snapshots(draw: st.DrawFn, roomy: bool = False) -> Snapshot:
    """`snapshots()` with images: each worker holds some, each job names one (or none); `roomy`: every worker
    has room for every job at once (cores, memory and storage never decide)."""
    snapshot = draw(snapshots())
    names = st.frozensets(st.sampled_from(IMAGES), max_size=2)
    workers = [dataclasses.replace(w, images=draw(names)) for w in snapshot.workers]
    if roomy:
        workers = [dataclasses.replace(w, free_cores_mcpu=1 << 40, free_memory_bytes=None, free_storage_bytes=None)
                   for w in workers]
    queues = {user: [dataclasses.replace(c, image_names=draw(names)) for c in queue]
              for user, queue in snapshot.queues.items()}
    return dataclasses.replace(snapshot, workers=workers, queues=queues)


def _cold(snapshot: Snapshot) -> Snapshot:
    """`snapshot` with no worker holding any image."""
    return dataclasses.replace(snapshot, workers=[dataclasses.replace(w, images=frozenset()) for w in snapshot.workers])


@settings(max_examples=examples(1000), deadline=None)
@given(warm_snapshots())
def test_preferring_workers_that_hold_the_image_keeps_every_promise(snapshot: Snapshot) -> None:
    _keeps_every_promise(snapshot)


@settings(max_examples=examples(2000), deadline=None)
@given(st.one_of(warm_snapshots(), warm_snapshots(roomy=True)))
def test_preferring_holders_changes_where_jobs_go_never_which_start_or_why_others_wait(snapshot: Snapshot) -> None:
    warm, cold = plan(snapshot), plan(_cold(snapshot))
    assert warm.waits == cold.waits
    assert warm.allocation == cold.allocation and warm.never_fit == cold.never_fit
    assert [(p.key, p.cores_mcpu) for p in warm.placements] == [(p.key, p.cores_mcpu) for p in cold.placements]


@settings(max_examples=examples(1000), deadline=None)
@given(warm_snapshots(roomy=True))
def test_with_room_everywhere_a_job_goes_to_a_worker_holding_its_image(snapshot: Snapshot) -> None:
    jobs = {c.key: c for queue in snapshot.queues.values() for c in queue}
    for p in plan(snapshot).placements:
        job = jobs[p.key]
        holders = [w.name for w in planner._eligible(job, snapshot.workers) if job.image_names & w.images]
        assert p.worker in holders or not holders, (p, holders)


def test_a_job_goes_to_the_worker_holding_its_image_unless_that_keeps_another_job_out() -> None:
    image = frozenset({"docker.io/library/python:3.11"})
    job = Candidate((1, 1), "ann", "p1", 1000, image_names=image)
    workers = [Worker("w0", 0, 2000), Worker("w1", 0, 2000, images=image)]
    result = plan(Snapshot("standard", workers, [UserDemand("ann", 0, 1000)], {"ann": [job]}, jobs_per_cycle=10))
    assert [(p.key, p.worker) for p in result.placements] == [((1, 1), "w1")]

    # w1 holds the image but only w1 has room for the big job after it: first-fit places both.
    big = Candidate((1, 2), "ann", "p1", 2000)
    workers = [Worker("w0", 0, 1000), Worker("w1", 0, 2000, images=image)]
    result = plan(Snapshot("standard", workers, [UserDemand("ann", 0, 3000)], {"ann": [job, big]},
                           jobs_per_cycle=10))
    assert [(p.key, p.worker) for p in result.placements] == [((1, 1), "w0"), ((1, 2), "w1")]


def test_a_spend_that_reads_as_the_limit_has_reached_it() -> None:
    """Issue 36: one core for 450 ms is 5 micro-dollars at the local rate, 4.9999999999999996e-06 as a DOUBLE;
    with a limit of 5 micro-dollars the project is at its limit, and waits as above it."""
    spend_usd = 450_000 * (0.04 / (1000 * 3_600_000))
    assert spend_usd < 5e-6 and planner.limit_reached(spend_usd, 5e-6)
    assert not planner.limit_reached(spend_usd, 6e-6) and not planner.limit_reached(1e9, None)
    job = Candidate(key=(1, 1), user="ann", billing_project="p", cores_mcpu=250, reserve_micro_usd=1)
    snapshot = Snapshot("standard", [Worker("w0", 0, 1000)], [UserDemand("ann", 0, 250)], {"ann": [job]},
                        budgets={"p": Budget(limit_usd=5e-6, spend_usd=spend_usd)})
    [wait] = plan(snapshot).waits.values()
    assert (wait.code, wait.detail) == (planner.BILLING_LIMIT_REACHED,
                                        "billing project p spent $0.000005 of its $0.000005 limit")


@given(snapshots(), st.sampled_from(["alice", "root"]))
def test_a_paused_pool_places_nothing_and_says_so_for_every_job_it_was_given(snapshot: Snapshot, who: str) -> None:
    paused = dataclasses.replace(snapshot, paused_by=who)
    plan_ = plan(paused)
    assert plan_.placements == () and plan_.never_fit == ()
    keys = {job.key for queue in paused.queues.values() for job in queue}
    assert set(plan_.waits) == keys
    assert all(w.code == POOL_PAUSED and f"paused by {who}" in w.detail for w in plan_.waits.values())
    _keeps_every_promise(snapshot)  # and the same snapshot running keeps the others


def test_a_quota_of_four_cores_holds_and_names_itself() -> None:
    queue = [Candidate((1, i), "ann", "p1", 1000) for i in range(1, 7)]
    quotas = {("project", "p1"): Quota(max_running_cores_mcpu=4000, set_by="admin")}
    snapshot = Snapshot("standard", [Worker("w0", 0, 16000)], [UserDemand("ann", 1000, 6000)], {"ann": queue},
                        jobs_per_cycle=10, quotas=quotas, usage={("project", "p1"): Usage(1000, 1)})
    result = plan(snapshot)
    assert [p.key for p in result.placements] == [(1, 1), (1, 2), (1, 3)]  # 1 running + 3 = 4
    wait = result.waits[(1, 4)]
    assert (wait.code, wait.detail) == (planner.QUOTA_REACHED, "the quota of billing project p1 (set by admin) caps "
                                        "its running cores at 4: it runs 1 across every pool, 3 start this cycle, "
                                        "and the job needs 1")
    jobs_cap = {("user", "ann"): Quota(max_running_jobs=2, set_by="root")}
    result = plan(dataclasses.replace(snapshot, quotas=jobs_cap, usage={("user", "ann"): Usage(1000, 1)}))
    assert [p.key for p in result.placements] == [(1, 1)]
    assert result.waits[(1, 2)].detail == ("the quota of user ann (set by root) caps its running jobs at 2: it runs 1 "
                                           "across every pool and 1 start this cycle")


def test_a_user_at_a_quota_leaves_their_share_to_the_others() -> None:
    """Without the cap on ann's demand, fair share would hand her half of the free cores, which she cannot use
    under her quota, and bob would wait (OVER_FAIR_SHARE) beside idle cores."""
    ann = [Candidate((1, i), "ann", "p1", 1000) for i in range(1, 9)]
    bob = [Candidate((2, i), "bob", "p2", 1000) for i in range(1, 9)]
    snapshot = Snapshot("standard", [Worker("w0", 0, 8000)], [UserDemand("ann", 0, 8000), UserDemand("bob", 0, 8000)],
                        {"ann": ann, "bob": bob}, jobs_per_cycle=20,
                        quotas={("user", "ann"): Quota(max_running_cores_mcpu=2000)})
    result = plan(snapshot)
    assert result.allocation == {"ann": 2000, "bob": 6000}
    assert sum(1 for p in result.placements if p.key[0] == 2) == 6
    assert {result.waits[c.key].code for c in ann[2:]} <= {planner.QUOTA_REACHED, planner.QUEUED_BEHIND_OWN_JOBS}


def test_a_project_of_weight_two_gets_twice_the_share_of_one_of_weight_one() -> None:
    ann = [Candidate((1, i), "ann", "heavy", 1000) for i in range(1, 13)]
    bob = [Candidate((2, i), "bob", "light", 1000) for i in range(1, 13)]
    snapshot = Snapshot("standard", [Worker("w0", 0, 9000)],
                        [UserDemand("ann", 0, 12000), UserDemand("bob", 0, 12000)], {"ann": ann, "bob": bob},
                        jobs_per_cycle=30, quotas={("project", "heavy"): Quota(weight=2)})
    result = plan(snapshot)
    assert result.allocation == {"ann": 6000, "bob": 3000}
    assert sum(1 for p in result.placements if p.key[0] == 1) == 6
    assert sum(1 for p in result.placements if p.key[0] == 2) == 3
    assert "(fair-share weight 2)" not in result.waits[(2, 4)].detail
    assert result.waits[(1, 7)].detail.startswith("user ann runs 0 cores of pool standard (fair-share weight 2) ")
