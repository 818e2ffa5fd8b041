"""Every field limit that names a column fits that column, as the migrated
schema declares it (information_schema): a string no longer than the
VARCHAR or TEXT holds, an integer range inside the column type's. So a
value the limits let through is never a DataError, nor cut short."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from services.auth.field_limits import AUTH_FIELD_LIMITS
from services.common.fields import FieldLimits, Integer, Map, Repeated, Text
from services.db.database import Database
from services.frontend.field_limits import request_field_limits
from services.frontend.limits import Limits

INTEGER_RANGES = {"tinyint": 8, "smallint": 16, "mediumint": 24, "int": 32, "bigint": 64}


def column_limits(table: FieldLimits) -> Iterator[tuple[str, Text | Integer]]:
    for name, limit in table.items():
        parts = [limit]
        if isinstance(limit, Repeated):
            parts = [limit.each]
        elif isinstance(limit, Map):
            parts = [limit.key, limit.value]
        for part in parts:
            if isinstance(part, (Text, Integer)) and part.column is not None:
                yield name, part


TABLES = {"frontend": request_field_limits(Limits()), "auth": AUTH_FIELD_LIMITS}


async def columns(db: Database) -> dict[str, dict[str, Any]]:
    rows = await db.fetchall(
        "SELECT table_name AS t, column_name AS c, data_type, column_type, character_maximum_length AS chars,"
        " character_octet_length AS octets FROM information_schema.columns WHERE table_schema = DATABASE()")
    return {f"{r['t']}.{r['c']}": r for r in rows}


def integer_range(column: dict[str, Any]) -> tuple[int, int]:
    bits = INTEGER_RANGES[column["data_type"]]
    if "unsigned" in column["column_type"]:
        return 0, 2**bits - 1
    return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


@pytest.mark.parametrize("service", sorted(TABLES))
async def test_every_limit_fits_its_column(db: Database, service: str) -> None:
    schema = await columns(db)
    checked = 0
    for name, limit in column_limits(TABLES[service]):
        assert limit.column in schema, f"{name}: no column {limit.column}"
        column = schema[limit.column]
        if isinstance(limit, Text):
            assert column["data_type"] in ("varchar", "char", "text"), f"{name}: {limit.column} holds no text"
            if limit.max_chars is not None:
                assert limit.max_chars <= column["chars"], f"{name}: {limit.max_chars} > {column['column_type']}"
            if limit.max_bytes is not None:
                assert limit.max_bytes <= column["octets"], f"{name}: {limit.max_bytes} bytes > {column['column_type']}"
            assert limit.max_chars is not None or limit.max_bytes is not None
        else:
            assert column["data_type"] in INTEGER_RANGES, f"{name}: {limit.column} is not an integer column"
            least, most = integer_range(column)
            assert least <= limit.min and limit.max <= most, f"{name}: [{limit.min}, {limit.max}] > {column['column_type']}"
        checked += 1
    assert checked >= (40 if service == "frontend" else 10)


async def test_varchar_limits_are_the_columns_sizes_unless_a_rule_is_stricter(db: Database) -> None:
    """A limit below its column's size must be a known rule, not a typo."""
    schema = await columns(db)
    stricter = {}
    for table in TABLES.values():
        for name, limit in column_limits(table):
            if isinstance(limit, Text) and limit.max_chars is not None \
                    and limit.max_chars < schema[limit.column]["chars"]:
                stricter[name] = limit.max_chars
    assert stricter == {
        # Usernames and project names: the auth service's and BillingService's naming rules.
        "corral.auth.v1.CreateUserRequest.username": 64,
        "corral.auth.v1.LoginRequest.username": 64,  # no user's name is longer; checked before any hashing
        "corral.billing.v1.CreateBillingProjectRequest.name": 64,
        "corral.billing.v1.CreateBillingProjectRequest.members": 64,
        "corral.billing.v1.AddMemberRequest.username": 64,
        "corral.billing.v1.RemoveMemberRequest.username": 64,
        # The servicers append these to the client's token for the updates they make.
        "corral.batch.v1.CreateBatchRequest.idempotency_token": 94,  # + "/first"
        "corral.batch.v1.SubmitBatchRequest.idempotency_token": 93,  # + "/submit"
        "corral.batch.v1.RerunFailedJobsRequest.idempotency_token": 94,  # "rerun/" +
    }
