"""Every test is in a tier (tests/tiers.py): a new folder of tests must be named there, or `.ci/run` would
not know of it and `--all` would silently skip it."""

from __future__ import annotations

from tests.tiers import LONGEST_FIRST, QUICK, TESTS, TIERS


def test_every_folder_of_tests_is_a_tier() -> None:
    folders = {path.relative_to(TESTS).parts[0] for path in TESTS.rglob("test_*.py")}
    assert folders == set(TIERS)


def test_the_quick_tiers_are_tiers() -> None:
    assert set(QUICK) < set(TIERS)


def test_every_tier_has_its_place_in_the_run_order() -> None:
    assert sorted(LONGEST_FIRST) == sorted(TIERS)
