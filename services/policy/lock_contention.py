"""Resource locks: which ready jobs may start, and in what order to try them
(design §4 "Resource locks and predictive ordering", after Ganeti's
predictive queue).

A job declares at most one `LockRequest` per *level*; levels are free-form
names ("node", "instance", "network", ...). Two questions are answered here,
both pure:

* `conflicts`: would starting the job now clash with a lock a running job
  holds? Reader/writer semantics per level. The scheduler never starts a
  conflicting job.
* `static_weight` / `aged_weight` / `order_candidates`: Ganeti's guess of how
  likely the job is to wait on locks, used to try the least contended
  candidates first within a priority, with aging so that nothing starves.

The big lock: a job that declares ALL_EXCLUSIVE at the level `"*"`
(`BIG_LOCK`) needs every lock at every level, like Ganeti's BGL. Ganeti
weighs such a job `base + 15` always: 3 (the worst cell of the table) times
its 5 levels. corral's levels are not fixed, so the big lock weighs
`base + 3 * n_levels`, where `n_levels` is the number of levels being
considered (`order_candidates` passes the number of distinct levels among
all candidates and running jobs, so the big lock always sorts last among
equal priorities). It conflicts with every running job that holds any lock,
and every job holding a lock conflicts with it; jobs that declare no lock
never conflict with anything.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import types
from collections.abc import Iterable, Mapping, Sequence
from typing import Final, TypeVar


class LockMode(enum.Enum):
    """How a job takes the locks of one level (Ganeti's seven kinds)."""

    NONE = "none"
    SHARED = "shared"
    UNKNOWN_SHARED = "unknown_shared"
    ALL_SHARED = "all_shared"
    EXCLUSIVE = "exclusive"
    UNKNOWN_EXCLUSIVE = "unknown_exclusive"
    ALL_EXCLUSIVE = "all_exclusive"

    @classmethod
    def from_db(cls, text: str) -> LockMode:
        """The mode of a `job_locks.mode` value ('shared', 'all_exclusive', ...)."""
        return cls(text)

    @property
    def exclusive(self) -> bool:
        """A writer's mode (excludes every other holder it may overlap)."""
        return self in (LockMode.EXCLUSIVE, LockMode.UNKNOWN_EXCLUSIVE, LockMode.ALL_EXCLUSIVE)

    @property
    def named(self) -> bool:
        """A mode that lists the resources it takes."""
        return self in (LockMode.SHARED, LockMode.EXCLUSIVE)


@dataclasses.dataclass(frozen=True)
class LockRequest:
    """The locks a job takes (or holds) at one level."""

    mode: LockMode
    """How."""
    names: frozenset[str] = frozenset()
    """Which resources: non-empty for SHARED and EXCLUSIVE, empty otherwise."""

    def __post_init__(self) -> None:
        if self.mode.named != bool(self.names):
            raise ValueError(f"{self.mode.name} locks {'need' if self.mode.named else 'take no'} names")


K = TypeVar("K")
"""Whatever identifies a running job to `blocking_jobs`' caller."""

Locks = Mapping[str, LockRequest]
"""A job's locks by level."""

BIG_LOCK_LEVEL: Final = "*"
"""The level that stands for every level (Ganeti's Big Ganeti Lock)."""
BIG_LOCK: Final[Locks] = types.MappingProxyType({BIG_LOCK_LEVEL: LockRequest(LockMode.ALL_EXCLUSIVE)})
"""The locks of a job that needs everything exclusively."""
MAX_CONTENTION: Final = 3.0
"""The worst cell of the table: the job will surely wait."""

# Ganeti's table: the row is the pending job's mode at a level, the column
# the mode a running job holds there. A `_Named` cell applies when both name
# their resources: `hit` if the named sets intersect ("j = i"), else `miss`.
# Kept as data so the test can compare all 49 cells against the source.


@dataclasses.dataclass(frozen=True)
class _Named:
    hit: float
    miss: float


_COLUMNS = (
    LockMode.NONE, LockMode.SHARED, LockMode.UNKNOWN_SHARED, LockMode.ALL_SHARED,
    LockMode.EXCLUSIVE, LockMode.UNKNOWN_EXCLUSIVE, LockMode.ALL_EXCLUSIVE,
)
_ROWS: dict[LockMode, tuple[float | _Named, ...]] = {
    LockMode.NONE:              (0.0, 0.0,            0.0, 0.0, 0.0,            0.0, 0.0),
    LockMode.SHARED:            (0.3, 0.0,            0.0, 0.0, _Named(3, 0.3), 1.5, 3.0),
    LockMode.UNKNOWN_SHARED:    (0.3, 0.3,            0.3, 0.3, 1.5,            1.5, 3.0),
    LockMode.ALL_SHARED:        (0.3, 0.3,            0.3, 0.3, 3.0,            3.0, 3.0),
    LockMode.EXCLUSIVE:         (0.5, _Named(3, 0.5), 1.5, 3.0, _Named(3, 0.5), 1.5, 3.0),
    LockMode.UNKNOWN_EXCLUSIVE: (0.5, 1.5,            1.5, 3.0, 1.5,            1.5, 3.0),
    LockMode.ALL_EXCLUSIVE:     (0.5, 3.0,            3.0, 3.0, 3.0,            3.0, 3.0),
}  # fmt: skip
_TABLE = {(row, col): cell for row, cells in _ROWS.items() for col, cell in zip(_COLUMNS, cells, strict=True)}


def contention(pending: LockRequest, held: LockRequest) -> float:
    """Ganeti's guess of how badly `pending` would wait on `held` (same level):
    0 none, 0.3/0.5 none now but more later, 1.5 maybe, 3 surely."""
    cell = _TABLE[pending.mode, held.mode]
    if isinstance(cell, _Named):
        return float(cell.hit if pending.names & held.names else cell.miss)
    return float(cell)


def _check_big_lock(locks: Locks) -> None:
    request = locks.get(BIG_LOCK_LEVEL)
    if request is not None and request.mode not in (LockMode.ALL_EXCLUSIVE, LockMode.NONE):
        raise ValueError(f"the big lock ({BIG_LOCK_LEVEL!r}) is ALL_EXCLUSIVE only, not {request.mode.name}")


def _holds_big_lock(locks: Locks) -> bool:
    _check_big_lock(locks)
    request = locks.get(BIG_LOCK_LEVEL)
    return request is not None and request.mode is LockMode.ALL_EXCLUSIVE


def _big_lock_held(running_locks: Mapping[str, Sequence[LockRequest]]) -> bool:
    held = running_locks.get(BIG_LOCK_LEVEL, ())
    for request in held:
        _check_big_lock({BIG_LOCK_LEVEL: request})
    return any(request.mode is LockMode.ALL_EXCLUSIVE for request in held)


def _levels(job_locks: Locks, running_locks: Mapping[str, Sequence[LockRequest]]) -> set[str]:
    return {lvl for lvl in (*job_locks, *running_locks) if lvl != BIG_LOCK_LEVEL}


def static_weight(
    job_locks: Locks,
    running_locks: Mapping[str, Sequence[LockRequest]],
    base: float = 1.0,
    n_levels: int | None = None,
) -> float:
    """Ganeti's static predictive value of a job against the running jobs'
    locks (`running_locks[level]`: every lock held at that level).

    `base` plus, for each level the job declares, the worst `contention` of
    its lock against the locks held there. A level where nothing is held
    counts as held NONE, so declaring a lock costs its 0.3/0.5 even on an idle
    system, and adding a running lock can only raise the weight. A running
    big lock counts as ALL_EXCLUSIVE held at every level. The big lock itself
    weighs `base + 3 * n_levels`; `n_levels` defaults to the number of
    distinct levels in `job_locks` and `running_locks`, and must be at least
    the number of levels the job declares. The result lies in
    [base, base + 3 * n_levels]."""
    levels = _levels(job_locks, running_locks)
    declared = [lvl for lvl in job_locks if lvl != BIG_LOCK_LEVEL]
    if n_levels is None:
        n_levels = len(levels)
    elif n_levels < len(declared):
        raise ValueError(f"n_levels={n_levels} but the job declares {len(declared)} levels")
    if _holds_big_lock(job_locks):
        return base + MAX_CONTENTION * n_levels
    big_held = _big_lock_held(running_locks)
    weight = base
    for level in declared:
        held: list[LockRequest] = [LockRequest(LockMode.NONE), *running_locks.get(level, ())]
        if big_held:
            held.append(LockRequest(LockMode.ALL_EXCLUSIVE))
        weight += max(contention(job_locks[level], h) for h in held)
    return weight


def aged_weight(weight: float, age_s: float, tick_s: float = 30.0, k_ticks: int = 20) -> float:
    """`weight * max(0, 1 - ticks / k_ticks)` with the age quantized to whole
    ticks: a job that has waited `k_ticks` ticks weighs 0, the lightest
    there is. A negative age (clock skew) counts as 0."""
    if tick_s <= 0 or k_ticks <= 0:
        raise ValueError("tick_s and k_ticks must be positive")
    ticks = math.floor(max(age_s, 0.0) / tick_s)
    return weight * max(0.0, 1.0 - ticks / k_ticks)


def _requests_conflict(a: LockRequest, b: LockRequest) -> bool:
    if a.mode is LockMode.NONE or b.mode is LockMode.NONE:
        return False
    if not (a.mode.exclusive or b.mode.exclusive):
        return False  # readers share
    if a.mode.named and b.mode.named:
        return bool(a.names & b.names)
    # An UNKNOWN_* request may be any lock of the level, and ALL_* is every
    # one of them: assume they overlap. Conservative on purpose: a false
    # conflict delays a job, a missed one runs two writers at once.
    return True


def conflicts(job_locks: Locks, running_locks: Mapping[str, Sequence[LockRequest]]) -> bool:
    """Whether starting the job now would clash with a lock held by a running
    job: readers share, a writer excludes everyone; two named sets clash only
    if they intersect; UNKNOWN_* and ALL_* clash with any lock of the level
    that a writer is involved in. The big lock clashes with any lock at all."""
    _check_big_lock(job_locks)
    takes_any = any(r.mode is not LockMode.NONE for lvl, r in job_locks.items() if lvl != BIG_LOCK_LEVEL)
    held_any = any(
        r.mode is not LockMode.NONE for lvl, rs in running_locks.items() if lvl != BIG_LOCK_LEVEL for r in rs
    )
    big_held = _big_lock_held(running_locks)
    if _holds_big_lock(job_locks):
        return held_any or big_held
    if big_held and takes_any:
        return True
    return any(
        _requests_conflict(request, held)
        for level, request in job_locks.items()
        if level != BIG_LOCK_LEVEL
        for held in running_locks.get(level, ())
    )


def running_locks_by_level(running_jobs: Iterable[Locks]) -> dict[str, list[LockRequest]]:
    """Merge the locks of the running jobs into `running_locks[level]`."""
    by_level: dict[str, list[LockRequest]] = {}
    for locks in running_jobs:
        for level, request in locks.items():
            by_level.setdefault(level, []).append(request)
    return by_level


class HeldLocks:
    """The locks a set of running jobs hold, indexed so that a question costs what the *distinct* locks
    held cost, not what the holders do: a thousand jobs holding one of twenty names are twenty entries.
    Answers as `conflicts` and `running_locks_by_level` would over the same jobs, in the order they were
    added."""

    def __init__(self, running_jobs: Mapping[K, Locks] | None = None):
        self._order: dict[object, int] = {}
        self._by_level: dict[str, dict[LockRequest, list[object]]] = {}
        self._big: list[object] = []
        """Holders of the big lock."""
        self._any: list[object] = []
        """Holders of some lock at some level (not the big lock alone)."""
        for key, locks in (running_jobs or {}).items():
            self.add(key, locks)

    def add(self, key: object, locks: Locks) -> None:
        """One more running job and its locks."""
        self._order[key] = len(self._order)
        if _holds_big_lock(locks):
            self._big.append(key)
        taken = False
        for level, request in locks.items():
            if level == BIG_LOCK_LEVEL:
                continue
            self._by_level.setdefault(level, {}).setdefault(request, []).append(key)
            taken = taken or request.mode is not LockMode.NONE
        if taken:
            self._any.append(key)

    def __bool__(self) -> bool:
        return bool(self._order)

    def blocking(self, level: str, request: LockRequest) -> list[object]:
        """The holders whose locks clash with taking `request` at `level` (`conflicts` of that one level
        against each holder's locks), in the order they were added."""
        found: set[object] = set()
        if level == BIG_LOCK_LEVEL:
            _check_big_lock({level: request})
            if request.mode is LockMode.ALL_EXCLUSIVE:
                found.update(self._any, self._big)
        elif request.mode is not LockMode.NONE:
            found.update(self._big)
            for held, keys in self._by_level.get(level, {}).items():
                if _requests_conflict(request, held):
                    found.update(keys)
        return sorted(found, key=self._order.__getitem__)

    def by_level(self) -> dict[str, list[LockRequest]]:
        """`running_locks_by_level` of the holders, each distinct lock once (what the weights need)."""
        by_level = {level: list(requests) for level, requests in self._by_level.items()}
        if self._big:
            by_level[BIG_LOCK_LEVEL] = [BIG_LOCK[BIG_LOCK_LEVEL]]
        return by_level


@dataclasses.dataclass(frozen=True)
class LockInterest:
    """Which held locks can matter to jobs that want some locks: a held lock outside it neither clashes
    with any of their requests nor weighs more (`static_weight`) than a level where nothing is held, so
    leaving it out changes no decision. The big lock always matters."""

    everything: bool
    """A job wants the big lock: any held lock at all matters."""
    whole_levels: frozenset[str]
    """Levels where a job asks for a level-wide mode (or none): every name there matters."""
    names: Mapping[str, frozenset[str]]
    """Other levels: the names jobs ask for (and the level-wide holds, name '')."""

    @classmethod
    def of(cls, wanted: Iterable[Locks]) -> LockInterest:
        names: dict[str, set[str]] = {}
        whole: set[str] = set()
        for job_locks in wanted:
            for level, request in job_locks.items():
                if request.mode.named and level not in whole:
                    names.setdefault(level, set()).update(request.names)
                else:
                    whole.add(level)
                    names.pop(level, None)
        return cls(BIG_LOCK_LEVEL in whole, frozenset(whole),
                   {level: frozenset(level_names) for level, level_names in names.items()})

    def covers(self, level: str, name: str) -> bool:
        """Whether a lock held at `level` on `name` ('' for a level-wide hold) matters."""
        if self.everything or level == BIG_LOCK_LEVEL or level in self.whole_levels:
            return True
        return level in self.names and (name == "" or name in self.names[level])


def blocking_jobs(job_locks: Locks, running_jobs: Mapping[K, Locks]) -> list[K]:
    """The running jobs whose locks keep this one from starting (for "why
    isn't my job running?" and `corral locks`), in the mapping's order."""
    return [
        key for key, held in running_jobs.items()
        if conflicts(job_locks, {level: [request] for level, request in held.items()})
    ]


def locks_from_rows(rows: Iterable[tuple[str, str, str]]) -> dict[str, LockRequest]:
    """A job's locks from its `job_locks` rows `(level, mode, lock_name)`.

    The table has one row per name, and nothing in it forbids two modes at
    one level; such a level is merged conservatively: exclusive if either is,
    ALL over UNKNOWN over named, names united."""
    by_level: dict[str, list[tuple[LockMode, str]]] = {}
    for level, mode, name in rows:
        by_level.setdefault(level, []).append((LockMode.from_db(mode), name))
    locks = {}
    for level, entries in by_level.items():
        modes = {mode for mode, _ in entries}
        exclusive = any(m.exclusive for m in modes)
        if modes & {LockMode.ALL_SHARED, LockMode.ALL_EXCLUSIVE}:
            mode = LockMode.ALL_EXCLUSIVE if exclusive else LockMode.ALL_SHARED
        elif modes & {LockMode.UNKNOWN_SHARED, LockMode.UNKNOWN_EXCLUSIVE}:
            mode = LockMode.UNKNOWN_EXCLUSIVE if exclusive else LockMode.UNKNOWN_SHARED
        else:
            mode = LockMode.EXCLUSIVE if exclusive else LockMode.SHARED
        names = frozenset(name for m, name in entries if m.named) if mode.named else frozenset()
        locks[level] = LockRequest(mode, names)
    return locks


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A Ready job the scheduler might start."""

    job_key: tuple[int, int]
    """(batch_id, job_id): the last tie-break, so the order is total."""
    priority: int
    """Higher goes first."""
    locks: Locks
    """What the job declares, by level."""
    ready_since_s: float
    """When it became Ready (seconds, the same clock as `now_s`): its age."""


def order_candidates(
    candidates: Sequence[Candidate],
    running_locks: Mapping[str, Sequence[LockRequest]],
    now_s: float,
    base: float = 1.0,
    tick_s: float = 30.0,
    k_ticks: int = 20,
) -> list[Candidate]:
    """Candidates in the order to try them: higher priority first, then lower
    aged weight, then job key. Conflicting candidates stay in the list (the
    scheduler filters them with `conflicts` as it starts jobs, since each
    start changes what is held)."""
    # One level count for everyone: the big lock's weight must be comparable
    # across candidates that declare different levels.
    levels = _levels({}, running_locks).union(*(_levels(c.locks, {}) for c in candidates))
    n_levels = len(levels)

    def key(c: Candidate) -> tuple[int, float, tuple[int, int]]:
        weight = static_weight(c.locks, running_locks, base=base, n_levels=n_levels)
        return (-c.priority, aged_weight(weight, now_s - c.ready_since_s, tick_s, k_ticks), c.job_key)

    return sorted(candidates, key=key)
