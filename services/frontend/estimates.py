"""EstimateBatch's figures for a checked bunch of jobs (docs/engine.md, "Estimates before running").

Each job is priced as it would be stored (`validate.job_row`: its cores and memory after the pool's rules, its
timeout), by the SQL functions that price a reservation (estimate_store):

- the worst case: what `schedule_jobs` reserves before an attempt starts, for its timeout (or the project's
  max_job_duration) plus the kill allowance;
- the expected cost: the same price for the median measured time of the earlier jobs of the same `name`
  attribute that succeeded in the project (every attempt of each summed), or, with no such history, for its
  whole timeout (or the project's max_job_duration).

The median, not the mean: one job that hung until its timeout, or one that failed at once, does not move it.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from corral.batch.v1 import batch_service_pb2 as pb
from services.frontend.estimate_store import NAME_KEY, EstimateStore


def expected_ms(times_ms: Sequence[int]) -> int | None:
    """What a job whose earlier runs took `times_ms` is expected to take: their median (None: no history)."""
    if not times_ms:
        return None
    return max(1, round(statistics.median(times_ms)))


def price_groups(rows: Sequence[dict[str, Any]], names: Sequence[str | None],
                 history: Mapping[str, Sequence[int]]
                 ) -> tuple[list[tuple[int, int, int, int | None, int | None]], int]:
    """The jobs' `job_row`s and names as (count, cores_mcpu, memory_bytes, timeout_ms, expected_ms) of identical
    jobs, so that a batch of many alike sends few rows to price; and how many jobs had history."""
    groups: Counter[tuple[int, int, int | None, int | None]] = Counter()
    from_history = 0
    for row, name in zip(rows, names):
        expected = expected_ms(history.get(name, ())) if name else None
        from_history += expected is not None
        groups[(row["cores_mcpu"], row.get("memory_bytes", 0), row.get("timeout_ms"), expected)] += 1
    return [(n, *key) for key, n in sorted(groups.items(), key=str)], from_history


async def estimate(store: EstimateStore, project: str, limited: bool, rows: Sequence[dict[str, Any]],
                   specs: Sequence[Any]) -> pb.EstimateBatchResponse:
    """The figures of checked jobs `specs` of `project`, whose `job_row`s are `rows`."""
    names = [spec.attributes.get(NAME_KEY) or None for spec in specs]
    history = await store.history_ms(project, {n for n in names if n})
    groups, from_history = price_groups(rows, names, history)
    prices = await store.prices(project, groups)
    return pb.EstimateBatchResponse(
        worst_case_micro_usd=prices.worst_case_micro_usd, expected_micro_usd=prices.expected_micro_usd,
        n_jobs=len(rows), n_jobs_from_history=from_history, n_jobs_from_timeout=len(rows) - from_history,
        limited=limited)
