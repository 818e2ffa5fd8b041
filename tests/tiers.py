"""The suite's tiers: a test's tier is the folder it is in under tests/, and is also its marker.

`scripts/test.sh` with no paths runs the quick tiers (unit, db, service); `scripts/test.sh --all`, which
`.ci/run` calls, runs every tier; `--tiers e2e,oci` chooses some. Naming files or folders, a `-m`
expression or `--lf` chooses tests directly, whatever their tier. Tests marked `slow` (soaks, benchmark
sizes) run only when the `-m` expression names `slow`.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.examples import THOROUGH_VARIABLE

TIERS = {
    "unit": "pure code, no processes",
    "db": "procedures and stores on a private MariaDB",
    "service": "services over real gRPC on loopback",
    "e2e": "a whole corral up, and the CLI as a user runs it",
    "faults": "each fault program's short version against a real corral up",
    "bench": "each benchmark's figures print, at the smallest size",
    "helm": "the chart, the image and the Envoy configs",
    "oci": "containers under real runc",
    "clouds": "the cloud providers through their SDKs, against loopback servers",
    "pipeline": "the pipeline library (corral.pipeline): its model, its local backend, and one corral up",
    "web": "the web UI in a real browser (Chromium)",
}
LONGEST_FIRST = ("e2e", "web", "faults", "oci", "bench", "pipeline", "clouds", "helm", "service", "db", "unit")
"""The order the tiers run in: modules that each start a whole system first, many short tests last, so that
the two processes of `scripts/test.sh` end together rather than one waiting on the other's last `corral up`
(pytest-xdist hands out modules in this order as each process becomes free)."""
QUICK = ("unit", "db", "service")
"""What `scripts/test.sh` runs when it is not told what to run."""

TESTS = Path(__file__).parent


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("corral tiers")
    group.addoption("--all", action="store_true", help="run every tier (what CI runs)")
    group.addoption("--tiers", metavar="T1,T2", help=f"run these tiers, of {', '.join(TIERS)}")


def pytest_configure(config: pytest.Config) -> None:
    for tier, what in TIERS.items():
        config.addinivalue_line("markers", f"{tier}: the {tier} tier, {what} (a test's folder under tests/)")
    if "slow" in (config.option.markexpr or ""):  # the costliest properties' full search (tests/examples.py)
        os.environ[THOROUGH_VARIABLE] = "1"


def chosen_tiers(config: pytest.Config) -> set[str] | None:
    """The tiers to run, or None for whatever the command line named."""
    if config.getoption("--all"):
        return set(TIERS)
    if named := config.getoption("--tiers"):
        tiers = {t.strip() for t in named.split(",") if t.strip()}
        if unknown := tiers - set(TIERS):
            raise pytest.UsageError(f"--tiers: no tier {', '.join(sorted(unknown))} (there are {', '.join(TIERS)})")
        return tiers
    if config.args_source != pytest.Config.ArgsSource.TESTPATHS or config.option.markexpr or config.option.lf:
        return None  # paths, a marker expression or the last run's failures chose
    return set(QUICK)


def tier_of(item: pytest.Item) -> str | None:
    try:
        folder = item.path.relative_to(TESTS).parts[0]
    except (ValueError, IndexError):
        return None
    return folder if folder in TIERS else None


@pytest.hookimpl(tryfirst=True)  # before `-m` reads the tiers' markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tiers = chosen_tiers(config)
    with_slow = "slow" in (config.option.markexpr or "")
    kept, dropped = [], []
    for item in items:
        tier = tier_of(item)
        if tier is not None:
            item.add_marker(tier)
        chosen = tiers is None or tier in tiers
        (kept if chosen and (with_slow or item.get_closest_marker("slow") is None) else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    kept.sort(key=_run_order)  # stable: a module's tests stay together and in order
    items[:] = kept


def _run_order(item: pytest.Item) -> int:
    tier = tier_of(item)
    return LONGEST_FIRST.index(tier) if tier in LONGEST_FIRST else len(LONGEST_FIRST)
