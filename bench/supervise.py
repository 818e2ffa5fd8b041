"""supervise: how fast `corral up` gets over a killed process, and how fast everything ends with it.

The benchmark runs `corral up` with its own private MariaDB in a temporary
data directory (the runner's server is not used: MariaDB is one of the
processes that must end with `corral up`), keeps its workers busy with
`sleep` jobs, and measures, by polling every 20 ms:

  failover         the leading driver SIGKILLed -> a standby has committed
                   a new leader epoch (per round; median and worst);
  restart          the same kill -> the killed driver, started again by
                   `corral up`, serves (its "serves again" line);
  sigkill-gone     `corral up` itself SIGKILLed, with workers running jobs
                   -> every process it had started (MariaDB, services,
                   workers, jobs) has ended;
  clean-stop       a new `corral up` on the same data directory (it
                   recovers the database) with workers running jobs,
                   SIGTERMed -> it has exited, having stopped everything.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import signal
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pymysql

import corral
from bench.common import BenchContext, positive_int, progress
from services.common.processes import PidFiles, PidRecord
from services.db.database import DatabaseConfig
from services.up import process as up_process
from services.up.process import UpProcess

NAME = "supervise"
HELP = "failover and restart of a killed driver, and the end of everything with a killed corral up"

DEFAULT_ROUNDS, SMOKE_ROUNDS = 5, 1
POLL_S = 0.02
T = TypeVar("T")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=positive_int, metavar="N",
                        help=f"leader kills (default {DEFAULT_ROUNDS}; {SMOKE_ROUNDS} with --smoke)")


def figure_names() -> list[str]:
    """Every figure a run prints, in order."""
    return [f"{NAME}.failover_s.p50", f"{NAME}.failover_s.max", f"{NAME}.restart_s.p50", f"{NAME}.restart_s.max",
            f"{NAME}.sigkill_gone_s", f"{NAME}.clean_stop_s"]


def _until(check: Callable[[], T], timeout_s: float, what: str) -> T:
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout_s} s")
        time.sleep(POLL_S)
    return value


def _query(up: UpProcess, sql: str) -> list[tuple[Any, ...]]:
    config = DatabaseConfig.from_url(up.endpoints["database"])
    password = (up.data_dir / "mariadb" / "admin.password").read_text().strip()
    kwargs = {**config.connect_kwargs(), "password": password}
    kwargs["database"] = kwargs.pop("db", config.database)
    conn = pymysql.connect(**kwargs)
    try:
        with conn.cursor() as cursor:
            cursor.execute(sql)
            return list(cursor.fetchall())
    finally:
        conn.close()


def _busy(up: UpProcess, n_jobs: int, seconds: int) -> int:
    """Submit `n_jobs` sleep jobs; return the batch id once one runs."""
    builder = corral.BatchBuilder("default", attributes={"name": "bench-supervise"})
    for _ in range(n_jobs):
        builder.job("busybox", ["sleep", str(seconds)], cores=1)
    with corral.Client(up.endpoints["frontend"], up.admin_token, ca_cert=up.endpoints["ca_cert"]) as client:
        batch_id = client.submit(builder).batch_id
    _until(lambda: _query(up, f"SELECT 1 FROM attempts WHERE batch_id = {batch_id} AND start_time_ms IS NOT NULL "
                              "AND end_time_ms IS NULL"), 120, "a job to run")
    return batch_id


def _descendants(root: int) -> list[PidRecord]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                ppid = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            record = PidRecord.of(str(child), child)
            if record is not None:
                found.append(record)
                todo.append(child)
    return found


@dataclasses.dataclass
class Measured:
    failover_s: list[float] = dataclasses.field(default_factory=list)
    restart_s: list[float] = dataclasses.field(default_factory=list)
    sigkill_gone_s: float = 0.0
    n_ended: int = 0
    clean_stop_s: float = 0.0


def _kill_the_leader(up: UpProcess, measured: Measured) -> None:
    [(leader, epoch)] = _query(up, "SELECT leader_name, epoch FROM leader_epoch")
    name = f"driver-{up.endpoints['drivers'].split(',').index(leader)}"
    record = PidFiles(up.data_dir / "run" / "pids").read(name)
    assert record is not None and record.alive()
    said = len(up.output)
    killed_at = time.monotonic()
    os.kill(record.pid, signal.SIGKILL)
    _until(lambda: _query(up, f"SELECT 1 FROM leader_epoch WHERE epoch > {epoch}"), 60, "a new leader")
    measured.failover_s.append(time.monotonic() - killed_at)
    _until(lambda: any(line.startswith(f"{name} (pid ") and "serves again" in line for line in up.output[said:]),
           60, f"{name} to serve again")
    measured.restart_s.append(time.monotonic() - killed_at)
    progress(f"{NAME}: {name} killed: a new leader after {measured.failover_s[-1]:.2f} s, "
             f"{name} serves again after {measured.restart_s[-1]:.2f} s")


def measure(rounds: int) -> Measured:
    """Start corral up, kill its leader `rounds` times, kill it, start it again and stop it (blocking)."""
    measured = Measured()
    with tempfile.TemporaryDirectory(prefix="corral-bench-supervise-") as tmp:
        work = Path(tmp)
        progress(f"{NAME}: starting corral up")
        up = up_process.start(work, "--worker-cores", "2", "--max-workers", "1", "--idle-timeout", "300")
        try:
            _busy(up, 2, 600)
            for _ in range(rounds):
                _kill_the_leader(up, measured)
            # Every process: corral up's descendants, and the workers (with their jobs) a killed driver left,
            # which are not (their parent is gone).
            workers = PidFiles(up.data_dir / "run" / "pids").live("worker-")
            everything = _descendants(up.process.pid) + workers + [d for w in workers for d in _descendants(w.pid)]
            started = list({record.pid: record for record in everything}.values())
            killed_at = time.monotonic()
            up.process.kill()
            _until(lambda: not any(r.alive() for r in started), 60, "every process to end")
            measured.sigkill_gone_s = time.monotonic() - killed_at
            measured.n_ended = len(started)
            progress(f"{NAME}: corral up SIGKILLed: its {len(started)} processes ended in "
                     f"{measured.sigkill_gone_s:.2f} s")
        finally:
            up.stop()
        progress(f"{NAME}: starting corral up again on the same data directory")
        # A second worker: the first run's is still 'active' until the dead-worker detector sees it.
        again = up_process.start(work, "--worker-cores", "2", "--max-workers", "2", "--idle-timeout", "300")
        try:
            _busy(again, 2, 600)
        finally:
            stopping_at = time.monotonic()
            code = again.stop()
            measured.clean_stop_s = time.monotonic() - stopping_at
        if code != 0:
            raise RuntimeError(f"corral up exited with {code} on SIGTERM")
        progress(f"{NAME}: SIGTERM: corral up stopped everything in {measured.clean_stop_s:.2f} s")
    return measured


async def run(ctx: BenchContext, args: argparse.Namespace) -> dict[str, Any]:
    rounds = args.rounds or (SMOKE_ROUNDS if ctx.smoke else DEFAULT_ROUNDS)
    measured = await asyncio.to_thread(measure, rounds)
    f50, fmax, r50, rmax, gone, stop = figure_names()
    ctx.figures.add(f50, round(statistics.median(measured.failover_s), 2), "s")
    ctx.figures.add(fmax, round(max(measured.failover_s), 2), "s")
    ctx.figures.add(r50, round(statistics.median(measured.restart_s), 2), "s")
    ctx.figures.add(rmax, round(max(measured.restart_s), 2), "s")
    ctx.figures.add(gone, round(measured.sigkill_gone_s, 2), "s")
    ctx.figures.add(stop, round(measured.clean_stop_s, 2), "s")
    return {
        "rounds": rounds,
        "failover_s": [round(s, 3) for s in measured.failover_s],
        "restart_s": [round(s, 3) for s in measured.restart_s],
        "processes_ended_after_sigkill": measured.n_ended,
        "busy": "2 jobs of sleep 600 on one local worker of 2 cores",
        "smoke": ctx.smoke,
    }
