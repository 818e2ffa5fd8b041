"""Each service's database account can do what the service does and nothing else."""

from __future__ import annotations

from pathlib import Path

import pymysql
import pytest

from services.db.accounts import (
    ACCOUNTS, ADMIN_PROCEDURES, AUTH_TABLES, INTERNAL_FUNCTIONS, INTERNAL_PROCEDURES, grant_service_accounts,
)
from services.db.database import DatabaseConfig
from tests.conftest import service_url

PROCEDURES_DIR = Path(__file__).resolve().parents[2] / "sql" / "procedures"
DENIED = (1142, 1143, 1044, 1045, 1227, 1370, 1410, 1045)
"""ER_TABLEACCESS_DENIED, ER_COLUMNACCESS_DENIED, ER_DBACCESS_DENIED, ER_ACCESS_DENIED,
ER_SPECIFIC_ACCESS_DENIED, ER_PROCACCESS_DENIED, ER_CANT_CREATE_USER_WITH_GRANT."""


def connect(db_config: DatabaseConfig, service: str) -> pymysql.Connection:
    config = DatabaseConfig.from_url(service_url(db_config, service))
    kwargs = config.connect_kwargs(with_database=False)
    return pymysql.connect(**kwargs, database=config.database)


def refused(connection: pymysql.Connection, sql: str) -> bool:
    """Whether `sql` is refused for lack of privileges (any other error fails the test)."""
    with connection.cursor() as cursor:
        try:
            cursor.execute(sql)
        except (pymysql.err.OperationalError, pymysql.err.ProgrammingError, pymysql.err.InternalError) as e:
            assert e.args[0] in DENIED, f"{sql}: {e}"
            return True
    return False


def test_every_procedure_is_granted_to_a_service_or_internal() -> None:
    files = {p.stem for p in PROCEDURES_DIR.glob("*.sql")}
    granted = {name for account in ACCOUNTS.values() for name in account.procedures}
    assert granted | INTERNAL_PROCEDURES | ADMIN_PROCEDURES | INTERNAL_FUNCTIONS == files
    assert not granted & INTERNAL_PROCEDURES and not granted & ADMIN_PROCEDURES
    assert not (granted | INTERNAL_PROCEDURES | ADMIN_PROCEDURES) & INTERNAL_FUNCTIONS


def test_the_functions_are_functions(db_config: DatabaseConfig) -> None:
    """What accounts.py calls a function is created as one, and nothing else is (a function listed as a
    procedure would be granted EXECUTE ON PROCEDURE, which the server refuses)."""
    connection = pymysql.connect(**db_config.connect_kwargs(with_database=False))
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT routine_name FROM information_schema.routines "
                           "WHERE routine_schema = %s AND routine_type = 'FUNCTION'", (db_config.database,))
            assert {row[0] for row in cursor.fetchall()} == INTERNAL_FUNCTIONS
    finally:
        connection.close()


def test_the_services_cannot_read_each_others_secrets_or_change_the_schema(db_config: DatabaseConfig) -> None:
    for service in ACCOUNTS:
        connection = connect(db_config, service)
        try:
            for statement in ("CREATE TABLE x (a INT)", "DROP TABLE jobs", "ALTER TABLE jobs ADD COLUMN x INT",
                              "CREATE USER 'mallory'@'localhost'", "SELECT * FROM mysql.user",
                              "SET GLOBAL max_connections = 1", "SELECT 1 INTO OUTFILE '/tmp/corral-x'",
                              "SELECT * FROM corral_migrations", "CREATE PROCEDURE p() SELECT 1"):
                assert refused(connection, statement), f"{service} may {statement}"
            with connection.cursor() as cursor:  # without FILE, the server reads no file for it
                cursor.execute("SELECT LOAD_FILE('/etc/hostname')")
                assert cursor.fetchone() == (None,)
            for table in AUTH_TABLES:
                assert refused(connection, f"SELECT * FROM {table}") == (service != "auth"), (service, table)
        finally:
            connection.close()


def test_each_service_calls_only_its_own_procedures(db_config: DatabaseConfig) -> None:
    frontend, driver, auth = (connect(db_config, s) for s in ("frontend", "driver", "auth"))
    try:
        # A refusal happens before the procedure runs; its arguments need not be valid.
        assert refused(frontend, "CALL elect_leader('mallory', 0)")
        # The driver campaigns for the lease; it may not depose a leader by force.
        assert refused(driver, "CALL elect_leader('mallory', 0)")
        assert refused(frontend, "CALL acquire_leader_lease('mallory', 1000, 0)")
        assert refused(frontend, "CALL schedule_jobs(1, 'i', '[]', 0)")
        assert refused(driver, "CALL create_batch('p', 'u', NULL, NULL, 1, '[]', 0)")
        assert refused(auth, "SELECT * FROM jobs")
        assert refused(auth, "CALL commit_update(1, 1, 0)")
        for account in (frontend, driver):
            assert refused(account, "CALL complete_jobs_core(1, 0)")  # internal
            assert not refused(account, "SELECT COUNT(*) FROM jobs")
        # Billing projects change only through their procedures (each locks the row and checks its state).
        for account in (frontend, driver):
            assert refused(account, "INSERT INTO billing_projects (name, time_created_ms) VALUES ('x', 0)")
            assert refused(account, "UPDATE billing_projects SET state = 'open'")
            assert refused(account, "DELETE FROM billing_project_members")
        assert refused(driver, "CALL create_billing_project('x', '[]', NULL, 0)")
        assert not refused(frontend, "CALL create_billing_project('x', '[]', NULL, 0)")
        assert not refused(frontend, "CALL set_billing_project_open('x', FALSE)")
    finally:
        for connection in (frontend, driver, auth):
            connection.close()


def test_granting_again_narrows_what_was_granted(db_config: DatabaseConfig) -> None:
    driver = connect(db_config, "driver")
    try:
        with driver.cursor() as cursor:
            cursor.execute("SELECT COUNT(*) FROM jobs")
    finally:
        driver.close()
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(ACCOUNTS, "driver", ACCOUNTS["auth"])  # as if the driver's grant had shrunk
        grant_service_accounts(db_config, {s: "narrowed-pw" for s in ACCOUNTS}, prefix="corral_narrow_")
        config = DatabaseConfig.from_url(db_config.to_url())
        narrowed = pymysql.connect(**{**config.connect_kwargs(with_database=False), "user": "corral_narrow_driver",
                                      "password": "narrowed-pw"}, database=db_config.database)
        try:
            assert refused(narrowed, "SELECT COUNT(*) FROM jobs")
        finally:
            narrowed.close()


def test_only_the_driver_reads_sealed_secrets_and_only_the_frontend_writes_them(db_config: DatabaseConfig) -> None:
    frontend, driver, auth = (connect(db_config, s) for s in ("frontend", "driver", "auth"))
    try:
        assert not refused(frontend, "CALL create_billing_project('sealed', '[]', NULL, 0)")
        assert not refused(frontend, """INSERT INTO secrets (billing_project, name, file_names, sealed, key_id,
                                        created_by, time_created_ms)
                                        VALUES ('sealed', 's', '[]', 'box', 'k', 'a', 0)""")
        assert not refused(frontend, "SELECT name, file_names, key_id, created_by, time_created_ms FROM secrets")
        for statement in ("SELECT sealed FROM secrets", "SELECT * FROM secrets"):
            assert refused(frontend, statement), statement
        assert not refused(driver, "SELECT sealed FROM secrets WHERE billing_project = 'sealed'")
        for statement in ("DELETE FROM secrets", "UPDATE secrets SET sealed = ''",
                          "INSERT INTO secrets (billing_project, name, file_names, sealed, key_id, created_by, "
                          "time_created_ms) VALUES ('sealed', 't', '[]', '', 'k', 'a', 0)"):
            assert refused(driver, statement), statement
        assert refused(auth, "SELECT name FROM secrets")
        assert not refused(frontend, "DELETE FROM secrets WHERE billing_project = 'sealed' AND name = 's'")
    finally:
        for connection in (frontend, driver, auth):
            connection.close()


def test_granting_again_takes_back_column_grants(db_config: DatabaseConfig) -> None:
    passwords = {s: "column-pw" for s in ACCOUNTS}
    grant_service_accounts(db_config, passwords, prefix="corral_cols_")
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(ACCOUNTS, "frontend", ACCOUNTS["auth"])  # as if the frontend's grant had shrunk
        grant_service_accounts(db_config, passwords, prefix="corral_cols_")
    config = DatabaseConfig.from_url(db_config.to_url())
    narrowed = pymysql.connect(**{**config.connect_kwargs(with_database=False), "user": "corral_cols_frontend",
                                  "password": "column-pw"}, database=db_config.database)
    try:
        assert refused(narrowed, "SELECT name FROM secrets")
    finally:
        narrowed.close()
