"""`corral up`'s database: the private MariaDB in DATA/mariadb as a part it supervises (unless
--database-url names another server), migrated at each start, an account of its own for each service, the
administrator and a `default` billing project, and the shape of the local pools the flags ask for."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from services.auth.store import AuthStore
from services.common.parent_death import launcher
from services.common.processes import Child, Ending
from services.db.accounts import grant_service_accounts, service_passwords
from services.db.backup import restore
from services.db.database import Database, DatabaseConfig
from services.db.migrations import migrate
from services.db.server import PrivateMariaDB
from services.db.store import JobStore
from services.up.supervisor import Supervisor

ADMIN = "admin"
"""The administrator `corral up` makes sure of, and the CLI profile it writes for them."""
DEFAULT_PROJECT = "default"
"""The billing project `corral up` makes for the administrator."""


class DatabaseServer:
    """A private MariaDB. `corral up`'s (`in_data_dir`) is started through `parent_death` too: mariadbd
    cannot ask to die with us itself. While it is down, the services report NOT_SERVING and answer
    UNAVAILABLE; they reconnect once it is back."""

    name = "mariadb"

    def __init__(self, server: PrivateMariaDB):
        self.server = server
        self.admin: DatabaseConfig | None = None
        """The administrator's settings, once started."""

    @classmethod
    def in_data_dir(cls, root: Path) -> DatabaseServer:
        """The durable server of a data directory, that dies with this process."""
        return cls(PrivateMariaDB(root, fast_unsafe=False, launcher=launcher()))

    def start(self) -> None:
        self.admin = self.server.start()

    @property
    def pid(self) -> int | None:
        return self.server.process.pid if self.server.process is not None else None

    def exit_status(self) -> int | None:
        return self.server.process.poll() if self.server.process is not None else None

    def ready(self) -> bool:
        return True  # start() returns once it answers

    def ending(self) -> Ending | None:
        return Child(self.name, self.server.process) if self.server.process is not None else None

    def last_words(self) -> str:
        lines = self.server.error_log().strip().splitlines()
        return f"the last line of {self.server.root / 'error.log'}: {lines[-1] if lines else '(empty)'}"


def prepare(database_url: str | None, data: Path, supervisor: Supervisor,
            restore_from: Path | None = None) -> tuple[str, dict[str, str]]:
    """The administrator's URL of the database, migrated (after loading `restore_from` into it, if given),
    and each service's own URL. Without `database_url`, the data directory's private server, started now as
    a part of `supervisor`."""
    if database_url is None:
        database = DatabaseServer.in_data_dir(data / "mariadb")
        supervisor.start(database)
        assert database.admin is not None
        database_url = dataclasses.replace(database.admin, database="corral").to_url()
    if restore_from is not None:
        restored = restore(DatabaseConfig.from_url(database_url), restore_from)
        supervisor.say(f"database: restored {restored.batches} batches and {restored.jobs} jobs from {restore_from};"
                       f" {restored.open_attempts} attempts were running then: their jobs run again once their "
                       "workers are declared dead")
    else:
        migrate(DatabaseConfig.from_url(database_url), create_database=True)
    return database_url, service_databases(database_url, data)


def service_databases(admin_url: str, data: Path) -> dict[str, str]:
    """Each service's own database account (created or updated now) and its URL."""
    configs = grant_service_accounts(DatabaseConfig.from_url(admin_url), service_passwords(data / "secrets"))
    return {service: config.to_url() for service, config in configs.items()}


async def bootstrap(database_url: str) -> str:
    """An administrator with a fresh token, and a default billing project."""
    db = await Database.connect(DatabaseConfig.from_url(database_url))
    try:
        _, token = await AuthStore(db).ensure_admin(ADMIN)
        if await db.fetchone("SELECT 1 AS x FROM billing_projects WHERE name = 'default'") is None:
            await JobStore(db).create_billing_project(DEFAULT_PROJECT, [ADMIN])
        return token
    finally:
        await db.close()


async def configure_pools(database_url: str, worker_cores: int | None, max_workers: int | None) -> None:
    """Store the shape of the local pools (operator settings, kept across restarts): each
    worker's cores (its memory scaled to keep the pool's memory per core) and the most
    workers per pool."""
    if worker_cores is None and max_workers is None:
        return
    db = await Database.connect(DatabaseConfig.from_url(database_url))
    try:
        local_pools = "WHERE is_pool AND provider = 'local'"
        if worker_cores is not None:
            # MySQL assigns left to right: memory is scaled by the old core count.
            await db.execute(f"UPDATE instance_collections SET worker_memory_bytes = worker_memory_bytes DIV "
                             f"worker_cores * %s, worker_cores = %s {local_pools}",
                             (worker_cores, worker_cores), name="up_pool_cores")
        if max_workers is not None:
            await db.execute(f"UPDATE instance_collections SET max_instances = %s, max_live_instances = %s "
                             f"{local_pools}", (max_workers, max_workers), name="up_pool_size")
    finally:
        await db.close()


def without_password(url: str) -> str:
    """A database URL fit to print: the administrator's password is in DATA/mariadb/admin.password."""
    parsed = DatabaseConfig.from_url(url)
    return dataclasses.replace(parsed, password="").to_url() if parsed.password else url
