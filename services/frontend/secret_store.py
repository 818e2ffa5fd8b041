"""The SQL behind SecretService, and the check of the secrets a job mounts.

The frontend never reads a secret's box (its account may not select the
column: services/db/accounts.py): it writes boxes sealed for the driver's
key and reads names, file names and creation only.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Collection

import aiomysql
import pymysql

from services.db.database import Database
from services.db.store import wall_clock_ms


@dataclasses.dataclass(frozen=True)
class SecretInfo:
    """A secret as listed: never its contents."""

    billing_project: str
    name: str
    file_names: tuple[str, ...]
    created_by: str
    created_at_ms: int


@dataclasses.dataclass(frozen=True)
class ProjectAccess:
    """What decides who may use a billing project's secrets."""

    state: str
    """'open', 'closed' or 'deleted'."""
    members: frozenset[str]


class SecretExists(Exception):
    """create without `replace` for a name that is taken."""


_COLUMNS = "billing_project, name, file_names, created_by, time_created_ms"


def _info(row: dict) -> SecretInfo:
    return SecretInfo(row["billing_project"], row["name"], tuple(json.loads(row["file_names"])), row["created_by"],
                      row["time_created_ms"])


class SecretStore:
    """Rows of the `secrets` table (migration 0021)."""

    def __init__(self, db: Database, clock_ms: Callable[[], int] = wall_clock_ms):
        self.db = db
        self.clock_ms = clock_ms

    async def project(self, project: str) -> ProjectAccess | None:
        """The project's state and members; None if there is no such project."""
        rows = await self.db.fetchall(
            """SELECT p.state, m.user FROM billing_projects p
               LEFT JOIN billing_project_members m ON m.billing_project = p.name WHERE p.name = %s""",
            (project,), name="secret_project")
        if not rows:
            return None
        return ProjectAccess(rows[0]["state"], frozenset(r["user"] for r in rows if r["user"] is not None))

    async def create(self, project: str, name: str, file_names: Collection[str], sealed: bytes, key_id: str,
                     user: str, replace: bool) -> SecretInfo:
        """Store a sealed secret; with `replace`, over one of the same name. SecretExists otherwise."""
        # The box goes as hex: this aiomysql cannot pass bytes parameters (its escape_bytes_prefixed is gone
        # from the pymysql it runs with).
        values = (project, name, json.dumps(sorted(file_names)), sealed.hex(), key_id, user, self.clock_ms())

        async def body(cursor: aiomysql.Cursor) -> None:
            await cursor.execute("START TRANSACTION")
            try:
                if replace:
                    # Not ON DUPLICATE KEY UPDATE: that needs SELECT on `sealed`, which the frontend lacks.
                    await cursor.execute("DELETE FROM secrets WHERE billing_project = %s AND name = %s",
                                         (project, name))
                await cursor.execute(
                    """INSERT INTO secrets (billing_project, name, file_names, sealed, key_id, created_by,
                                            time_created_ms)
                       VALUES (%s, %s, %s, UNHEX(%s), %s, %s, %s)""", values)
            except BaseException:
                await cursor.execute("ROLLBACK")
                raise
            await cursor.execute("COMMIT")

        try:
            await self.db.retrying("create_secret", body)
        except pymysql.err.IntegrityError as e:
            if e.args and e.args[0] == 1062:  # ER_DUP_ENTRY
                raise SecretExists(name) from None
            raise
        found = await self.get(project, name)
        assert found is not None
        return found

    async def get(self, project: str, name: str) -> SecretInfo | None:
        row = await self.db.fetchone(f"SELECT {_COLUMNS} FROM secrets WHERE billing_project = %s AND name = %s",
                                     (project, name), name="get_secret")
        return None if row is None else _info(row)

    async def page(self, project: str, after: str, limit: int) -> list[SecretInfo]:
        """The project's secrets by name after `after`."""
        rows = await self.db.fetchall(
            f"""SELECT {_COLUMNS} FROM secrets WHERE billing_project = %s AND name > %s
                ORDER BY name LIMIT %s""", (project, after, limit), name="list_secrets")
        return [_info(row) for row in rows]

    async def delete(self, project: str, name: str) -> bool:
        """Whether there was such a secret."""
        return await self.db.execute("DELETE FROM secrets WHERE billing_project = %s AND name = %s",
                                     (project, name), name="delete_secret") > 0

    async def existing(self, project: str, names: Collection[str]) -> set[str]:
        """Which of `names` the project has."""
        wanted = sorted(set(names))
        if not wanted:
            return set()
        rows = await self.db.fetchall(
            f"SELECT name FROM secrets WHERE billing_project = %s AND name IN ({', '.join(['%s'] * len(wanted))})",
            (project, *wanted), name="existing_secrets")
        return {row["name"] for row in rows}
