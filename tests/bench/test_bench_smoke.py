"""The benchmarks run: `python -m bench sj-mjc --smoke` against the test
session's server prints every figure, writes its JSON and plot, and leaves
no schema behind. Nothing here looks at speed: figures are for people."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pymysql

from bench import sj_mjc
from bench.common import SCHEMA_PREFIX
from services.db.database import DatabaseConfig

REPO_DIR = Path(__file__).resolve().parents[2]
# `name: value unit`, the value a plain number.
SUMMARY_LINE = re.compile(r"^(?P<name>\S+): (?P<value>-?\d+(?:\.\d+)?) (?P<unit>\S+)$")


def database_url(config: DatabaseConfig) -> str:
    """A --database-url for the session's server; the schema name is ignored."""
    credentials = quote(config.user, safe="") + (f":{quote(config.password, safe='')}" if config.password else "")
    if config.unix_socket:
        return f"mysql://{credentials}@localhost/ignored?unix_socket={quote(config.unix_socket)}"
    return f"mysql://{credentials}@{config.host}:{config.port}/ignored"


def bench_schemas(config: DatabaseConfig) -> set[str]:
    conn = pymysql.connect(**config.connect_kwargs(with_database=False))
    try:
        with conn.cursor() as cursor:
            cursor.execute("SHOW DATABASES")
            return {name for (name,) in cursor.fetchall() if name.startswith(SCHEMA_PREFIX)}
    finally:
        conn.close()


def test_sj_mjc_smoke(mariadb_server: DatabaseConfig, tmp_path: Path) -> None:
    before = bench_schemas(mariadb_server)
    result = subprocess.run(
        [sys.executable, "-m", "bench", "sj-mjc", "--smoke", "--database-url", database_url(mariadb_server),
         "--out", str(tmp_path)],
        cwd=REPO_DIR, capture_output=True, text=True, timeout=240,
    )
    assert result.returncode == 0, result.stderr

    printed = {}
    for line in result.stdout.splitlines():
        match = SUMMARY_LINE.match(line)
        assert match, f"not a summary line: {line!r}"
        printed[match["name"]] = (float(match["value"]), match["unit"])
    expected = sj_mjc.figure_names(smoke=True)
    assert list(printed) == expected
    assert {"sj-mjc.sj+mjc.best", "sj-mjc.full.best", "sj-mjc.full.32conn.retries"} <= set(printed)
    for name, (value, unit) in printed.items():
        assert unit == ("retries" if name.endswith(".retries") else "jobs/s"), name
        assert value >= 0

    results = json.loads((tmp_path / "sj-mjc.json").read_text())
    assert {name: (f["value"], f["unit"]) for name, f in results["figures"].items()} == printed
    assert results["parameters"]["n_jobs_per_run"] == sj_mjc.SMOKE_JOBS
    assert {"cpu_count", "platform", "server_version", "git_commit", "timestamp"} <= set(results["machine"])
    assert (tmp_path / "sj-mjc.png").read_bytes().startswith(b"\x89PNG")

    assert bench_schemas(mariadb_server) == before
