"""What every benchmark shares: the database server, a fresh schema per run,
figures printed as `name: value unit`, and the results file.

A benchmark module (see `bench/__init__.py`) gets a `BenchContext`, records
its figures with `ctx.figures.add(...)` and returns its parameters; the
runner writes `<out>/<bench>.json` with figures, parameters and the facts
of the machine and server they were measured on.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime
import json
import os
import platform
import subprocess
import time
import sys
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol, TextIO

import pymysql

from services.db.database import Database, DatabaseConfig
from services.db.invariants import check_invariants
from services.db.migrations import drop_database, migrate
from services.db.server import PrivateMariaDB

REPO_DIR = Path(__file__).resolve().parents[1]
DEFAULT_OUT_DIR = REPO_DIR / "bench" / "results"
SCHEMA_PREFIX = "corral_bench_"
"""Every schema a benchmark creates starts with this and is dropped after its run."""

# Server settings that change what a figure means (durability above all).
_SERVER_VARIABLES = (
    "innodb_flush_log_at_trx_commit",
    "sync_binlog",
    "log_bin",
    "innodb_buffer_pool_size",
    "innodb_doublewrite",
)


@dataclasses.dataclass(frozen=True)
class Figure:
    """One measured number."""

    name: str
    """Dotted name, `<bench>.<what>`, e.g. `sj-mjc.full.best`."""
    value: float
    """The number, already rounded for printing."""
    unit: str
    """What it counts, e.g. `jobs/s`, `retries`."""

    def line(self) -> str:
        """The summary line: `name: value unit`."""
        value = int(self.value) if float(self.value).is_integer() else self.value
        return f"{self.name}: {value} {self.unit}"


class Figures:
    """The figures of one benchmark run, each printed as it is recorded."""

    def __init__(self, stream: TextIO = sys.stdout) -> None:
        self._stream = stream
        self._figures: list[Figure] = []

    def add(self, name: str, value: float, unit: str) -> Figure:
        """Record a figure and print its summary line."""
        figure = Figure(name, value, unit)
        self._figures.append(figure)
        print(figure.line(), file=self._stream, flush=True)
        return figure

    def as_json(self) -> dict[str, dict[str, Any]]:
        return {f.name: {"value": f.value, "unit": f.unit} for f in self._figures}


@dataclasses.dataclass(frozen=True)
class BenchContext:
    """What a benchmark module's `run` gets."""

    server: DatabaseConfig
    """The server to create fresh schemas on (its `database` is ignored)."""
    out_dir: Path
    """Where the JSON and any plot go (exists)."""
    smoke: bool
    """Tiny sizes: check that the benchmark works, in seconds."""
    figures: Figures
    """Record every figure here."""


class Benchmark(Protocol):
    """What a benchmark module provides; modules satisfy it structurally."""

    NAME: str
    """The subcommand, also the name of its results file."""
    HELP: str
    """One line for `python -m bench --help`."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Add the benchmark's own options."""

    async def run(self, ctx: BenchContext, args: argparse.Namespace) -> dict[str, Any]:
        """Measure, record figures in `ctx.figures` (and any other file in
        `ctx.out_dir`); return the parameters it ran with, for the JSON."""


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) of `values`, linearly interpolated
    between the two nearest ranks (numpy's default method)."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def progress(message: str) -> None:
    """A progress note on stderr, so stdout holds only summary lines."""
    print(message, file=sys.stderr, flush=True)


@contextlib.contextmanager
def database_server(url: str | None) -> Iterator[DatabaseConfig]:
    """The server named by `url`, or a private durable MariaDB for the run.

    The private one has production's durability (a flushed redo log on
    every commit) and is stopped by its pid on the way out, also on Ctrl-C
    or an exception."""
    if url:
        yield DatabaseConfig.from_url(url)
        return
    server = PrivateMariaDB(fast_unsafe=False)
    try:
        progress("starting a private MariaDB (durable settings)")
        yield server.start()
    finally:
        server.stop()


def database_statements(server: DatabaseConfig) -> tuple[int, int]:
    """The server's (Questions, Queries) so far: statements clients sent, and those plus every statement
    run inside stored programs."""
    connection = pymysql.connect(**server.connect_kwargs(with_database=False))
    try:
        with connection.cursor() as cursor:
            cursor.execute("SHOW GLOBAL STATUS WHERE Variable_name IN ('Questions', 'Queries')")
            found = {name: int(value) for name, value in cursor.fetchall()}
    finally:
        connection.close()
    return found["Questions"], found["Queries"]


@contextlib.asynccontextmanager
async def fresh_database(server: DatabaseConfig, pool_size: int) -> AsyncIterator[Database]:
    """A new schema with every migration applied and a pool of `pool_size`
    connections on it; the schema is dropped afterwards."""
    config = dataclasses.replace(server, database=f"{SCHEMA_PREFIX}{uuid.uuid4().hex[:12]}", pool_size=pool_size)
    try:
        await asyncio.to_thread(migrate, config, create_database=True)
        db = await Database.connect(config)
        try:
            yield db
            await check_consistent(db)
        finally:
            await db.close()
    finally:
        await asyncio.to_thread(drop_database, config)


async def check_consistent(db: Database) -> None:
    """The invariant checker (services.db.invariants) on a benchmark's schema once its run is over: every
    counter and aggregate the procedures maintain, recomputed from the base tables. A difference fails the
    benchmark, naming it: a fast run that left the books wrong is no result."""
    progress("checking the invariants")
    started = time.monotonic()
    problems = await check_invariants(db)
    if problems:
        raise RuntimeError(f"{len(problems)} invariant(s) broken after the run, e.g. " + "; ".join(problems[:5]))
    progress(f"invariants hold ({time.monotonic() - started:.1f} s to check)")


def _git_commit() -> str | None:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO_DIR, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_DIR, capture_output=True, text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return f"{commit}-dirty" if dirty else commit


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def machine_info(server: DatabaseConfig) -> dict[str, Any]:
    """Where the figures were measured: host, server version and settings, commit, time."""
    conn = pymysql.connect(**server.connect_kwargs(with_database=False))
    try:
        with conn.cursor() as cursor:
            cursor.execute("SELECT VERSION()")
            (version,) = cursor.fetchone()
            placeholders = ", ".join(["%s"] * len(_SERVER_VARIABLES))
            cursor.execute(f"SHOW GLOBAL VARIABLES WHERE Variable_name IN ({placeholders})", _SERVER_VARIABLES)
            variables = dict(cursor.fetchall())
    finally:
        conn.close()
    return {
        "cpu_count": os.cpu_count(),
        "memory_bytes": _memory_bytes(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "server_version": version,
        "server_variables": variables,
        "git_commit": _git_commit(),
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def write_results(
    out_dir: Path, bench: str, figures: Figures, parameters: dict[str, Any], machine: dict[str, Any]
) -> Path:
    """Write `<out_dir>/<bench>.json`; returns its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{bench}.json"
    document = {"bench": bench, "figures": figures.as_json(), "parameters": parameters, "machine": machine}
    path.write_text(json.dumps(document, indent=2, sort_keys=False) + "\n")
    return path
