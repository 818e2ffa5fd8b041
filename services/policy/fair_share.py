"""Fair share of cores between users, and the per-iteration job shares the
scheduler and the canceller take from it (design §3 and §4).

Pure functions over plain data: no database, no clock. The driver reads
`user_inst_coll_fair_share` (migration 0003) into `UserDemand`s, calls
`allocate_cores` with the pool's free cores, and turns the result into how
many jobs each user may schedule this iteration with `scheduling_shares`.

The allocation is *water-filling*: start from the user with the fewest
running cores, hand out free cores until they reach the next user's running
level, then split equally between them, and so on, until the cores or the
demand run out; nobody gets more than their ready demand. Everything is in
integer mcpu, so the result is exact and the same on every run.

Weighted: a user's `weight` (an integer, 1 by default; the planner makes it
the product of the user's quota weight and their billing project's, see
`services.policy.planner`) scales their level. A user's level is running
cores / weight, and topping up to level L gives each user L x weight - running
(within their demand): when every user wants more, a user of weight 2 ends
with twice the cores of one of weight 1. With every weight 1 this is the
plain water-filling above, to the mcpu.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction


@dataclasses.dataclass(frozen=True)
class UserDemand:
    """One user's state in one instance collection."""

    user: str
    """Who."""
    running_cores_mcpu: int
    """Cores of the user's Creating and Running jobs: the level they start from."""
    ready_cores_mcpu: int
    """Cores the user's Ready jobs ask for (cancellable demand of cancelled
    groups already left out by the view): the most they can be given."""
    weight: int = 1
    """Their fair-share weight: their level is running cores / weight."""

    def __post_init__(self) -> None:
        for field in ("running_cores_mcpu", "ready_cores_mcpu"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{field} must be a non-negative int, got {value!r}")
        if not isinstance(self.weight, int) or isinstance(self.weight, bool) or self.weight < 1:
            raise ValueError(f"weight must be a positive int, got {self.weight!r}")


def _by_user(demands: Iterable[UserDemand]) -> dict[str, UserDemand]:
    by_user: dict[str, UserDemand] = {}
    for d in demands:
        if d.user in by_user:
            # Two rows for one user would be a bug in the query that built
            # them; summing silently would hide it.
            raise ValueError(f"user {d.user!r} appears twice")
        by_user[d.user] = d
    return by_user


def _filled(level: int, d: UserDemand) -> int:
    """What `d` receives when everyone is topped up to `level` (capped by demand)."""
    return min(max(level - d.running_cores_mcpu, 0), d.ready_cores_mcpu)


def water_level(to_give: int, demands: Iterable[UserDemand]) -> int:
    """The highest level L >= 0 at which topping every user up to L (running plus given, at most their
    demand) costs no more than `to_give`; at least max(running + ready) when `to_give` covers every demand.

    The cost of L is piecewise linear and rises by one mcpu per step for each user whose running cores are
    at most L and whose running plus ready cores are above it, so it is walked from breakpoint to breakpoint
    (a sort of the users, not a search over L)."""
    slope_changes: dict[int, int] = {}
    top = 0
    for d in demands:
        end = d.running_cores_mcpu + d.ready_cores_mcpu
        top = max(top, end)
        if d.ready_cores_mcpu > 0:
            slope_changes[d.running_cores_mcpu] = slope_changes.get(d.running_cores_mcpu, 0) + 1
            slope_changes[end] = slope_changes.get(end, 0) - 1
    level, cost, slope = 0, 0, 0
    for point in sorted(slope_changes):
        if point > level:
            cost_at_point = cost + slope * (point - level)
            if cost_at_point > to_give:  # within this stretch, where slope > 0
                return level + (to_give - cost) // slope
            level, cost = point, cost_at_point
        slope += slope_changes[point]
    return top


def allocate_cores(free_cores_mcpu: int, demands: Sequence[UserDemand]) -> dict[str, int]:
    """Water-fill `free_cores_mcpu` over the users: mcpu per user.

    Every user of `demands` is in the result (0 when they get nothing). The
    sum is exactly min(free, total ready demand); nobody gets more than their
    ready demand; a user who still wants cores ends at least at the level
    (running + allocated) of every user who was given any, up to 1 mcpu of
    rounding. The 1-mcpu remainders go to the eligible users in name order,
    so the result depends neither on the order of `demands` nor on chance.
    """
    if free_cores_mcpu < 0:
        raise ValueError(f"free_cores_mcpu must be non-negative, got {free_cores_mcpu}")
    by_user = _by_user(demands)
    to_give = min(free_cores_mcpu, sum(d.ready_cores_mcpu for d in by_user.values()))
    if any(d.weight != 1 for d in by_user.values()):
        return _allocate_weighted(to_give, by_user)
    lo = water_level(to_give, by_user.values())
    allocation = {user: _filled(lo, d) for user, d in by_user.items()}

    # Raising the level by one would overspend, so fewer than "users still
    # below their demand at the level" mcpu remain: one each, by name.
    remainder = to_give - sum(allocation.values())
    at_level = sorted(
        user for user, d in by_user.items()
        if d.running_cores_mcpu <= lo < d.running_cores_mcpu + d.ready_cores_mcpu
    )
    for user in at_level[:remainder]:
        allocation[user] += 1
    return allocation


def _weighted_fill(level: int, d: UserDemand) -> int:
    """What `d` receives when everyone is topped up to weighted `level` (capped by demand)."""
    return min(max(level * d.weight - d.running_cores_mcpu, 0), d.ready_cores_mcpu)


def _allocate_weighted(to_give: int, by_user: Mapping[str, UserDemand]) -> dict[str, int]:
    """`allocate_cores` with weights: the highest integer level L (cores per unit of weight) whose top-up
    costs at most `to_give`, found by bisection (the cost is monotone in L), then what is left, less than
    what one more step of L costs, handed out in name order, each user at most their step."""
    lo, hi = 0, max((d.running_cores_mcpu + d.ready_cores_mcpu + d.weight - 1) // d.weight
                    for d in by_user.values()) if by_user else 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if sum(_weighted_fill(mid, d) for d in by_user.values()) <= to_give:
            lo = mid
        else:
            hi = mid - 1
    allocation = {user: _weighted_fill(lo, d) for user, d in by_user.items()}
    remainder = to_give - sum(allocation.values())
    for user in sorted(by_user):
        if remainder <= 0:
            break
        step = min(_weighted_fill(lo + 1, by_user[user]) - allocation[user], remainder)
        allocation[user] += step
        remainder -= step
    return allocation


def fair_share_order(demands: Iterable[UserDemand]) -> list[str]:
    """Users from the lowest level (running cores / weight) to the highest (ties by name): the order the
    scheduler serves them in, and who wins when shares are short."""
    return [d.user for d in sorted(demands, key=lambda d: (Fraction(d.running_cores_mcpu, d.weight), d.user))]


def _apportion(total: int, weights: Mapping[str, int], order: Sequence[str]) -> dict[str, int]:
    """Split `total` in proportion to `weights` by largest remainder.

    Exact integer arithmetic; equal remainders are broken by `order`. Every
    share is at most ceil(total * w / sum(w)), so when total <= sum(w) no
    share exceeds its weight."""
    result = {user: 0 for user in weights}
    weight_sum = sum(weights.values())
    if total <= 0 or weight_sum == 0:
        return result
    rank = {user: i for i, user in enumerate(order)}
    remainders = []
    for user, weight in weights.items():
        quotient, rest = divmod(total * weight, weight_sum)
        result[user] = quotient
        remainders.append((-rest, rank[user], user))
    left = total - sum(result.values())
    for _, _, user in sorted(remainders)[:left]:
        result[user] += 1
    return result


def scheduling_shares(
    allocation: Mapping[str, int], demands: Sequence[UserDemand], total_jobs: int = 300
) -> dict[str, int]:
    """How many jobs each user may schedule this iteration.

    `total_jobs` is split in proportion to the allocated cores (largest
    remainder), then every user with allocated cores whom rounding left at 0
    gets 1, taken from the largest share; when there are more such users
    than jobs, the first `total_jobs` of them in fair-share order get 1.
    Users without an allocation get 0; the sum is `total_jobs` whenever
    anyone has an allocation. Every user of `demands` is in the result."""
    if total_jobs < 0:
        raise ValueError(f"total_jobs must be non-negative, got {total_jobs}")
    by_user = _by_user(demands)
    unknown = set(allocation) - set(by_user)
    if unknown:
        raise ValueError(f"allocation for users without a demand: {sorted(unknown)}")
    order = fair_share_order(by_user.values())
    served = [user for user in order if allocation.get(user, 0) > 0]
    shares = {user: 0 for user in order}
    if len(served) >= total_jobs:
        for user in served[:total_jobs]:
            shares[user] = 1
        return shares
    shares.update(_apportion(total_jobs, {u: allocation[u] for u in served}, order))
    # The minimum of 1 keeps a user with a sliver of cores from rounding to
    # nothing, which would starve them for as long as a big user is busy.
    # Shares sum to total_jobs >= len(served), so while someone has 0,
    # someone else has 2 or more to give.
    rank = {user: i for i, user in enumerate(order)}
    for user in served:
        if shares[user] == 0:
            donor = max(served, key=lambda u: (shares[u], rank[u]))
            shares[donor] -= 1
            shares[user] = 1
    return shares


def cancel_shares(cancellable_by_user: Mapping[str, int], total: int = 300, minimum: int = 20) -> dict[str, int]:
    """How many jobs the canceller drains for each user this iteration.

    Each user gets min(what they have, `minimum`), and what is left of
    `total` is split in proportion to what they still have, never beyond it.
    So the sum is min(total, everything) unless the minimums alone exceed
    `total` (many users): then it is the sum of the minimums. Users with
    nothing to cancel get 0."""
    if total < 0 or minimum < 0:
        raise ValueError("total and minimum must be non-negative")
    for user, n in cancellable_by_user.items():
        if n < 0:
            raise ValueError(f"user {user!r} has a negative count {n}")
    # A fixed floor per user is what keeps one user's million-job batch from
    # making everybody else's cancellation wait (the cancellation RFC's 20).
    shares = {user: min(n, minimum) for user, n in cancellable_by_user.items()}
    rest = {user: n - shares[user] for user, n in cancellable_by_user.items()}
    budget = max(0, total - sum(shares.values()))
    if budget >= sum(rest.values()):
        extra = rest
    else:
        extra = _apportion(budget, rest, sorted(rest))
    return {user: shares[user] + extra[user] for user in cancellable_by_user}
