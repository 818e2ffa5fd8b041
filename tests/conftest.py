"""Fixtures shared by every tier: a private MariaDB for the session and a
fresh, migrated database for each test that asks for one; object stores on
loopback (a GCS emulator and Azurite) for the tests that ask for them. The
tiers themselves, and which run, are in tests/tiers.py."""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from services.db.accounts import ACCOUNTS, grant_service_accounts
from services.db.database import Database, DatabaseConfig
from services.db.server import PrivateMariaDB
from services.driver.store import DriverStore
from tests import storage_emulators
from tests.databases import MigratedDatabases
from tests.storage_emulators import Emulator
from tests.world import FakeClock, World


@pytest.fixture(scope="session", autouse=True)
def process_runtime_cgroups() -> Iterator[None]:
    """Process runtimes that tests leave open (a worker closes its own) have their cgroups removed at the end
    of the session, so that nothing of them is left on the host."""
    from services.worker.process_cgroups import ProcessCgroups
    started: list[ProcessCgroups] = []
    original = ProcessCgroups.start

    def start(self: ProcessCgroups) -> None:
        original(self)
        started.append(self)

    ProcessCgroups.start = start  # type: ignore[method-assign]
    try:
        yield
    finally:
        ProcessCgroups.start = original  # type: ignore[method-assign]
        for cgroups in started:
            cgroups.close()


@pytest.fixture(scope="session")
def mariadb_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DatabaseConfig]:
    """Connection settings of a server the tests may create databases on.

    A private server in a temporary directory, unless CORRAL_TEST_DATABASE_URL
    names an existing one: tests then only create and drop corral_test_*
    databases there."""
    url = os.environ.get("CORRAL_TEST_DATABASE_URL")
    if url:
        yield DatabaseConfig.from_url(url)
        return
    server = PrivateMariaDB()
    try:
        yield server.start()
    finally:
        if not server.alive():  # died under the tests: keep why, for whoever looks into the failures
            kept = tmp_path_factory.getbasetemp() / "mariadb-died.log"
            kept.write_text(server.error_log())
            print(f"\nthe session's MariaDB died before the end; its error log is kept in {kept}")
        server.stop()


@pytest.fixture(scope="session")
def migrated_databases(mariadb_server: DatabaseConfig) -> Iterator[MigratedDatabases]:
    """The session's migrated databases (tests/databases.py), dropped at its end."""
    databases = MigratedDatabases(mariadb_server)
    try:
        yield databases
    finally:
        databases.close()


@pytest.fixture
def db_config(migrated_databases: MigratedDatabases) -> Iterator[DatabaseConfig]:
    """A database of the test's own, exactly as migrating leaves it (emptied after the test for the next
    one, or dropped if the test changed its schema: tests/databases.py)."""
    config = migrated_databases.take(pool_size=40)
    try:
        yield config
    finally:
        migrated_databases.give_back(config)


@pytest.fixture
async def db(db_config: DatabaseConfig) -> AsyncIterator[Database]:
    """A pool on the test's own database."""
    database = await Database.connect(db_config)
    try:
        yield database
    finally:
        await database.close()


@pytest.fixture
def clock() -> FakeClock:
    """Milliseconds that move only when the test moves them."""
    return FakeClock()


@pytest.fixture
async def world(db: Database, clock: FakeClock) -> World:
    """A billing project 'proj' (alice, bob) and an elected leader epoch."""
    return await World(db, DriverStore(db, clock), clock).setup()


_SERVICE_PASSWORDS = {service: secrets.token_urlsafe(16) for service in ACCOUNTS}


def service_url(config: DatabaseConfig, service: str) -> str:
    """The URL `service` ('auth', 'frontend', 'driver') logs in with on `config`'s database: its own
    account with only its privileges (services.db.accounts), as in a deployment. The tests' accounts
    are named corral_test_*, so a shared server's corral_* accounts are never touched."""
    configs = grant_service_accounts(config, _SERVICE_PASSWORDS, prefix="corral_test_")
    return configs[service].to_url()


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    """gcp-storage-emulator on loopback, for the session (each test makes buckets of its own)."""
    with storage_emulators.running(storage_emulators.start_gcs(tmp_path_factory.mktemp("gcs"))) as emulator:
        yield emulator


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    """Azurite's blob service on loopback, for the session (each test makes containers of its own)."""
    with storage_emulators.running(storage_emulators.start_azurite(tmp_path_factory.mktemp("azurite"))) as emulator:
        yield emulator


IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")

BASE_IMAGE_CACHE = Path(os.environ.setdefault(
    "CORRAL_BASE_IMAGE_CACHE", str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
                                   / "corral" / "base-images")))
"""Where every `corral up` the tests start (they inherit this environment) and every test that builds a
base image keep the built images (services.registry.seed_cache): each is built once per machine, not once
per test deployment."""


def in_parallel_worker() -> bool:
    """Whether this process is one of several running the tests at once (pytest-xdist's workers): host-wide
    settings are then put back by the process that started them, once all are done."""
    return "PYTEST_XDIST_WORKER" in os.environ


def pytest_sessionstart(session: pytest.Session) -> None:
    if not in_parallel_worker():
        session.config.stash[_IP_FORWARD_BEFORE] = IP_FORWARD.read_text()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The host's IPv4 forwarding as the run found it, whatever a worker that made bridges left (it is
    host-wide and left on: another of the run's tests may still need it, so only the end puts it back)."""
    before = session.config.stash.get(_IP_FORWARD_BEFORE, None)
    if before is not None and IP_FORWARD.read_text() != before:
        IP_FORWARD.write_text(before)


_IP_FORWARD_BEFORE = pytest.StashKey[str]()


def _ip_forwarding_put_back() -> Iterator[None]:
    before = IP_FORWARD.read_text()
    try:
        yield
    finally:
        if not in_parallel_worker():
            IP_FORWARD.write_text(before)


@pytest.fixture
def host_ip_forwarding() -> Iterator[None]:
    """For tests whose workers run containers with networks: a worker turns the host's IPv4 forwarding on
    for its bridges and leaves it on (it is host-wide); the test puts it back as it found it, unless other
    tests run beside it (then the run's end does: pytest_sessionfinish)."""
    yield from _ip_forwarding_put_back()


@pytest.fixture(scope="module")
def module_host_ip_forwarding() -> Iterator[None]:
    """`host_ip_forwarding` for a module whose tests share one `corral up`: put back after its last test."""
    yield from _ip_forwarding_put_back()
