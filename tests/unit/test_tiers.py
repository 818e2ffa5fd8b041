"""Every test is in a tier (tests/tiers.py): a new folder of tests must be named there, or `.ci/run` would
not know of it and `--all` would silently skip it."""

from __future__ import annotations

from tests.examples import THOROUGH_VARIABLE, examples
from tests.tiers import LONGEST_FIRST, QUICK, TESTS, TIERS


def test_every_folder_of_tests_is_a_tier() -> None:
    folders = {path.relative_to(TESTS).parts[0] for path in TESTS.rglob("test_*.py")}
    assert folders == set(TIERS)


def test_the_quick_tiers_are_tiers() -> None:
    assert set(QUICK) < set(TIERS)


def test_every_tier_has_its_place_in_the_run_order() -> None:
    assert sorted(LONGEST_FIRST) == sorted(TIERS)


def test_the_costliest_properties_search_fully_only_when_slow_tests_are_asked_for(monkeypatch) -> None:
    monkeypatch.delenv(THOROUGH_VARIABLE, raising=False)
    assert (examples(2000), examples(100), examples(30)) == (400, 50, 30)
    monkeypatch.setenv(THOROUGH_VARIABLE, "1")
    assert examples(2000) == 2000
