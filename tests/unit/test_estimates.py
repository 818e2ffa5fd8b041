"""EstimateBatch's pure parts: a name's history as its jobs' times, the median, and identical jobs priced once."""

from __future__ import annotations

from services.frontend.estimate_store import HISTORY_ATTEMPTS_PER_NAME, job_times
from services.frontend.estimates import expected_ms, price_groups


def test_a_jobs_attempts_are_summed_and_a_name_cut_at_its_limit_drops_its_last_job() -> None:
    rows = [{"name": "a", "batch_id": 1, "job_id": 1, "ms": 5}, {"name": "a", "batch_id": 1, "job_id": 1, "ms": 15},
            {"name": "a", "batch_id": 2, "job_id": 7, "ms": 40}, {"name": "b", "batch_id": 1, "job_id": 2, "ms": -3}]
    assert job_times(rows) == {"a": [20, 40], "b": [0]}
    cut = [{"name": "c", "batch_id": 1, "job_id": i // 2, "ms": 1} for i in range(HISTORY_ATTEMPTS_PER_NAME)]
    assert len(job_times(cut)["c"]) == HISTORY_ATTEMPTS_PER_NAME // 2 - 1


def test_the_median_is_what_a_job_is_expected_to_take() -> None:
    assert expected_ms([]) is None
    assert expected_ms([10, 1000, 20]) == 20
    assert expected_ms([10, 20]) == 15
    assert expected_ms([0]) == 1


def test_identical_jobs_are_priced_as_one_row_with_their_count() -> None:
    rows = [{"cores_mcpu": 1000, "memory_bytes": 4, "timeout_ms": 60_000}, {"cores_mcpu": 1000, "memory_bytes": 4,
                                                                             "timeout_ms": 60_000},
            {"cores_mcpu": 500}]
    groups, from_history = price_groups(rows, ["x", "x", None], {"x": [30_000]})
    assert sorted(groups, key=str) == sorted([(2, 1000, 4, 60_000, 30_000), (1, 500, 0, None, None)], key=str)
    assert from_history == 2
