"""Where the autoscaler puts new machines, and how long it leaves a pool or a region alone after a cloud
refused one. Pure: no I/O, no clock of its own (times are given), property-tested in
tests/unit/test_placement.py.

A refusal is one of three kinds (services.driver.providers.errors says which error is which):

- REGION: the region is out of quota or capacity (`retry_elsewhere`). That region is avoided for the
  pool for a while; the pool's other regions stay open, so demand that may run anywhere goes there,
  and demand that may run only in avoided regions waits.
- TRANSIENT: anything that may pass by itself (rate limit, 5xx, a time-out). The pool waits a short,
  growing while.
- CONFIGURATION: permission denied or a request the cloud rejects as malformed. Retrying every cycle
  cannot help and floods the cloud's audit log: the pool waits a long, growing while (an operator must
  act; a success ends the wait).

Each wait doubles with each refusal in a row, from `initial_s` up to `max_s`; a success in a region ends
the region's and the pool's waits.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Collection, Iterable, Mapping, Sequence


class Refusal(enum.Enum):
    """How the autoscaler reacts to a refusal (see the module's docstring)."""

    REGION = "region"
    TRANSIENT = "transient"
    CONFIGURATION = "configuration"


@dataclasses.dataclass(frozen=True)
class Backoff:
    """A wait that doubles with each refusal in a row."""

    initial_s: float
    """The wait after the first refusal."""
    max_s: float
    """The longest wait, however many refusals in a row."""

    def __post_init__(self) -> None:
        if not 0 < self.initial_s <= self.max_s:
            raise ValueError(f"a back-off needs 0 < initial_s <= max_s (got {self.initial_s}, {self.max_s})")

    def after(self, refusals: int) -> float:
        """The wait after `refusals` (>= 1) refusals in a row."""
        return min(self.max_s, self.initial_s * 2.0 ** min(max(refusals, 1) - 1, 64))


@dataclasses.dataclass(frozen=True)
class BackoffSettings:
    """How long the autoscaler leaves a region, or a whole pool, alone after a refusal."""

    region: Backoff = Backoff(60.0, 1800.0)
    """A region out of quota or capacity, for one pool (QuotaExceeded, CapacityExhausted)."""
    transient: Backoff = Backoff(15.0, 300.0)
    """A pool whose last creation failed in a way that may pass (TransientError, an unclassified error)."""
    configuration: Backoff = Backoff(300.0, 3600.0)
    """A pool whose last creation was refused as not allowed or malformed (PermissionDenied,
    InvalidRequest)."""

    def of(self, kind: Refusal) -> Backoff:
        return {Refusal.REGION: self.region, Refusal.TRANSIENT: self.transient,
                Refusal.CONFIGURATION: self.configuration}[kind]


@dataclasses.dataclass
class _Wait:
    refusals: int
    until_s: float


class Backoffs:
    """The waits in force, per pool (region None) and per (pool, region)."""

    def __init__(self, settings: BackoffSettings = BackoffSettings()):
        self.settings = settings
        self._waits: dict[tuple[str, str | None], _Wait] = {}

    def refused(self, pool: str, region: str, kind: Refusal, now_s: float) -> float:
        """Record a refusal; returns how long the region (REGION) or the pool (the others) now waits."""
        key = (pool, region if kind is Refusal.REGION else None)
        wait = self._waits.get(key)
        refusals = (wait.refusals if wait is not None else 0) + 1
        wait_s = self.settings.of(kind).after(refusals)
        self._waits[key] = _Wait(refusals, now_s + wait_s)
        return wait_s

    def succeeded(self, pool: str, region: str) -> None:
        """A machine was created in `region`: the region and the pool wait no more."""
        self._waits.pop((pool, region), None)
        self._waits.pop((pool, None), None)

    def _open(self, key: tuple[str, str | None], now_s: float) -> bool:
        wait = self._waits.get(key)
        return wait is None or now_s >= wait.until_s

    def pool_open(self, pool: str, now_s: float) -> bool:
        """Whether the pool may create machines now."""
        return self._open((pool, None), now_s)

    def open_regions(self, pool: str, regions: Iterable[str], now_s: float) -> list[str]:
        """Those of `regions` (in their order) the pool may create machines in now."""
        return [r for r in regions if self._open((pool, r), now_s)]


@dataclasses.dataclass(frozen=True)
class RegionDemand:
    """Ready cores of jobs that may run in the same regions."""

    regions: frozenset[str] | None
    """Where they may run; None: anywhere."""
    cores_mcpu: int


def demand_by_region(heads: Iterable[tuple[int | None, int]], ready_mcpu: int,
                     regions: Mapping[int, str]) -> list[RegionDemand]:
    """A pool's ready cores (`ready_mcpu`) split by the regions their jobs may run in, in the proportions of
    `heads`: (regions_bits, cores_mcpu) of the jobs at the heads of the users' queues, those the scheduler
    looks at first (bit i of regions_bits: region `regions[i]`; None: anywhere). No heads: all anywhere.

    The split is taken from the heads, not from the queue at large, so that `place` makes machines only in
    regions where a job the scheduler looks at may run: each machine made is given work, and the queue moves.
    Split by the whole queue instead, a batch of region-a jobs queued before as many region-b jobs had
    machines made in region-b (the earlier region of a tie) that the scheduler, looking at region-a's jobs,
    never used: idle, they left, and were made again, for ever (the design's deadlock with regions)."""
    by_bits: dict[int | None, int] = {}
    for bits, cores_mcpu in heads:
        by_bits[bits] = by_bits.get(bits, 0) + cores_mcpu
    seen_mcpu = sum(by_bits.values())
    if seen_mcpu <= 0:
        return [RegionDemand(None, ready_mcpu)]
    return [RegionDemand(None if bits is None else
                         frozenset(name for bit, name in regions.items() if (bits >> bit) & 1),
                         cores_mcpu * ready_mcpu // seen_mcpu) for bits, cores_mcpu in by_bits.items()]


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where one new machine goes."""

    region: str
    anywhere: bool
    """Every job it is for may run in any region (so a provider may put it in another region)."""


def place(n: int, cores_mcpu: int, regions: Sequence[str], open_regions: Collection[str],
          demand: Iterable[RegionDemand]) -> list[Placement]:
    """Up to `n` new machines of `cores_mcpu` each, for `demand`.

    `regions` is the pool's, in order of preference; `open_regions` those it may use now. Each demand
    goes to the first open region (in `regions`' order) it may run in: demand that may run anywhere to
    the first open region, which is the preferred one unless it is avoided. Demand with no open region
    waits. Machines go one at a time to the region with the most demand not yet covered (ties: the
    earlier region). When no demand waits, all `n` are placed (the caller sized `n` from the whole
    demand, less free cores); when some waits, no region gets machines beyond its own demand, so
    demand that cannot be served does not bring machines elsewhere."""
    uncovered = dict.fromkeys(regions, 0)
    restricted: set[str] = set()
    waiting_mcpu = 0
    for d in demand:
        if d.cores_mcpu <= 0:
            continue
        target = next((r for r in regions if r in open_regions and (d.regions is None or r in d.regions)), None)
        if target is None:
            waiting_mcpu += d.cores_mcpu
            continue
        uncovered[target] += d.cores_mcpu
        if d.regions is not None:
            restricted.add(target)
    served = [r for r in regions if uncovered[r] > 0]
    placed: list[Placement] = []
    for _ in range(max(0, n) if served else 0):
        region = max(served, key=lambda r: uncovered[r])  # max() keeps the first of equals
        if uncovered[region] <= 0 and waiting_mcpu > 0:
            break
        placed.append(Placement(region, region not in restricted))
        uncovered[region] -= max(1, cores_mcpu)
    return placed
