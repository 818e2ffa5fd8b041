"""Database accounts of the services: each logs in as itself, with only what it uses.

The migration runner and `corral up` use an administrator account (the
private server's root). The services never do: `grant_service_accounts`
creates `corral_auth`, `corral_frontend` and `corral_driver` and grants each:

- **auth**: the users and tokens tables, and nothing else;
- **frontend**, **driver**: SELECT on every other table and view, EXECUTE on
  the procedures each one calls, and the few direct writes each makes;
- the **secrets** table only as each needs it: the frontend writes rows and
  reads every column but the sealed contents, the driver reads them all (it
  alone holds the key that opens them: services.common.sealing).

No account gets DDL, FILE, PROCESS, SUPER or GRANT, and neither the frontend
nor the driver can read the users and tokens tables (password and token
hashes): the `usernames` view (migration 0020) shows them the names alone.
Stored procedures and triggers run with their definer's rights
(the migrating administrator), so EXECUTE on a procedure is all a caller
needs for what it changes inside. A procedure or table added later is
granted by the next run (corral up runs it at every start); a procedure no
service is listed for is refused to all, and `tests/db/test_accounts.py`
checks that every procedure is either granted, internal, or for the
administrator's tools.
"""

from __future__ import annotations

import dataclasses
import re
import secrets
from collections.abc import Mapping
from pathlib import Path

import pymysql

from services.common.files import write_atomically
from services.db.database import DatabaseConfig

AUTH_TABLES = ("users", "tokens")
"""What only the auth service reads and writes."""
RUNNER_TABLES = ("corral_migrations", "corral_routines")
"""The migration runner's own bookkeeping: no service reads it."""
PRIVATE_TABLES = ("secrets",)
"""Left out of `read_all`: an account reads them only as its `reads` say."""


@dataclasses.dataclass(frozen=True)
class Account:
    """What one service may do in corral's database."""

    read_all: bool
    """SELECT on every table and view except the auth, runner and private tables."""
    writes: Mapping[str, tuple[str, ...]]
    """Direct writes: table → privileges (INSERT, UPDATE, DELETE)."""
    procedures: tuple[str, ...]
    """Procedures it calls (EXECUTE)."""
    reads: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    """SELECT on private tables: table → the columns it may read (empty: all of them)."""


ACCOUNTS: dict[str, Account] = {
    "auth": Account(read_all=False, writes={t: ("SELECT", "INSERT", "UPDATE", "DELETE") for t in AUTH_TABLES},
                    procedures=()),
    "frontend": Account(
        read_all=True,
        writes={"secrets": ("INSERT", "UPDATE", "DELETE")},
        procedures=("create_batch", "create_update", "insert_job_groups", "insert_jobs", "commit_update",
                    "cancel_job_group", "hold_jobs", "release_jobs", "set_pool_paused", "delete_batch", "discard_batch",
                    "rerun_failed_jobs", "check_job_limits",
                    "read_ready_heads", "create_billing_project", "add_billing_project_member",
                    "remove_billing_project_member", "set_billing_project_limit", "set_billing_project_open",
                    "delete_billing_project", "estimate_job_prices", "set_quota"),
        # Everything but the sealed contents, which it could not open anyway.
        reads={"secrets": ("billing_project", "name", "file_names", "key_id", "created_by", "time_created_ms")}),
    "driver": Account(
        read_all=True, writes={}, reads={"secrets": ()},
        procedures=("acquire_leader_lease", "renew_leader_lease", "release_leader_lease", "create_instance",
                    "activate_instance", "deactivate_instance", "schedule_jobs", "mark_jobs_started",
                    "add_attempt_resources", "mark_jobs_complete", "heartbeat_rollup", "cancel_ready_jobs",
                    "publish_batch_events", "cancel_failed_job_groups", "recheck_completions",
                    "claim_batch_callbacks", "record_batch_callback", "cancel_batches_over_limit",
                    "release_children", "cancel_pending_jobs", "cancel_unaffordable_jobs", "read_ready_heads",
                    "enroll_instance", "place_instance", "set_product_rates", "add_regions")),
}

INTERNAL_PROCEDURES = frozenset({
    "add_attempt_usage", "bill_attempt_usage", "billing_limit_check", "check_completions", "check_epoch",
    "complete_jobs_core", "create_change_tables", "create_completion_tables", "decide_retries",
    "queue_update_groups_for_check", "record_job_changes", "job_limits_check", "release_children_lock",
    "release_children_apply", "release_children_record", "fan_out_check",
})
"""Called only by other procedures and triggers (definer's rights): no service executes them."""

INTERNAL_FUNCTIONS = frozenset({"billing_limit_reached", "job_reserve_ms", "job_worst_case_micro_usd"})
"""The stored functions (in sql/procedures/ too), called only inside procedures (definer's rights): no
service executes them, and EXECUTE is granted on procedures alone."""

ADMIN_PROCEDURES = frozenset({"elect_leader"})
"""Run only under the administrator's account, by tools: `elect_leader` starts an epoch by force, deposing
whoever leads (benchmarks and tests that call driver procedures without a driver, a forced failover by hand).
A driver campaigns for the lease instead, and may not force an epoch."""


def account_user(service: str, prefix: str = "corral_") -> str:
    """The database user of a service (tests use their own prefix, so as not to touch a deployment's)."""
    return f"{prefix}{service}"


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _statements(database: str, user_name: str, account: Account, host: str, tables: list[str],
                procedures: set[str]) -> list[str]:
    user = f"'{user_name}'@'{host}'"
    db = _quote(database)
    out = []
    if account.read_all:
        out += [f"GRANT SELECT ON {db}.{_quote(t)} TO {user}" for t in tables
                if t not in AUTH_TABLES and t not in RUNNER_TABLES and t not in PRIVATE_TABLES]
    for table, columns in account.reads.items():
        if table in tables:
            select = f"SELECT ({', '.join(map(_quote, columns))})" if columns else "SELECT"
            out.append(f"GRANT {select} ON {db}.{_quote(table)} TO {user}")
    for table, privileges in account.writes.items():
        out.append(f"GRANT {', '.join(privileges)} ON {db}.{_quote(table)} TO {user}")
    out += [f"GRANT EXECUTE ON PROCEDURE {db}.{_quote(p)} TO {user}" for p in account.procedures if p in procedures]
    return out


def _revoke_all(cursor: pymysql.cursors.Cursor, database: str, user: str, host: str) -> None:
    """Take back every grant `user` holds on `database`: database-wide, per table and per routine
    (REVOKE ALL ON db.* leaves the last two)."""
    who, db = f"'{user}'@'{host}'", _quote(database)
    cursor.execute("SELECT 1 FROM mysql.db WHERE User = %s AND Host = %s AND Db = %s", (user, host, database))
    if cursor.fetchone():
        cursor.execute(f"REVOKE ALL PRIVILEGES ON {db}.* FROM {who}")
    cursor.execute("SELECT Table_name FROM mysql.tables_priv WHERE User = %s AND Host = %s AND Db = %s",
                   (user, host, database))
    for (table,) in cursor.fetchall():
        cursor.execute(f"REVOKE ALL PRIVILEGES ON {db}.{_quote(table)} FROM {who}")
    cursor.execute("SELECT Routine_name FROM mysql.procs_priv WHERE User = %s AND Host = %s AND Db = %s "
                   "AND Routine_type = 'PROCEDURE'", (user, host, database))
    for (routine,) in cursor.fetchall():
        cursor.execute(f"REVOKE EXECUTE ON PROCEDURE {db}.{_quote(routine)} FROM {who}")


def grant_service_accounts(admin: DatabaseConfig, passwords: Mapping[str, str], host: str = "localhost",
                           prefix: str = "corral_") -> dict[str, DatabaseConfig]:
    """Create (or update) each service's account with its password and exactly its privileges on
    `admin.database`; returns each service's connection settings. Idempotent: privileges on this
    database are revoked and granted again, so a narrowed grant takes effect."""
    if not re.fullmatch(r"[A-Za-z0-9_.%:-]+", host) or not re.fullmatch(r"[A-Za-z0-9_]+", prefix):
        raise ValueError(f"bad account host {host!r} or prefix {prefix!r}")
    connection = pymysql.connect(**admin.connect_kwargs(with_database=False))
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
                           (admin.database,))
            tables = sorted(row[0] for row in cursor.fetchall())
            cursor.execute("SELECT routine_name FROM information_schema.routines WHERE routine_schema = %s "
                           "AND routine_type = 'PROCEDURE'", (admin.database,))
            procedures = {row[0] for row in cursor.fetchall()}
            configs = {}
            for service, account in ACCOUNTS.items():
                user = account_user(service, prefix)
                cursor.execute("CREATE USER IF NOT EXISTS %s@%s IDENTIFIED BY %s", (user, host, passwords[service]))
                cursor.execute("ALTER USER %s@%s IDENTIFIED BY %s", (user, host, passwords[service]))
                _revoke_all(cursor, admin.database, user, host)
                for statement in _statements(admin.database, user, account, host, tables, procedures):
                    cursor.execute(statement)
                configs[service] = dataclasses.replace(admin, user=user, password=passwords[service])
        return configs
    finally:
        connection.close()


def service_passwords(directory: Path) -> dict[str, str]:
    """Each service's database password, kept 0600 in `directory` (made on first use, 0700)."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    passwords = {}
    for service in ACCOUNTS:
        path = directory / f"db-{service}.password"
        if not path.exists():
            write_atomically(path, secrets.token_urlsafe(24).encode(), 0o600)
        passwords[service] = path.read_text().strip()
    return passwords
