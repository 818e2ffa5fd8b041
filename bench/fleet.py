"""A fleet of simulated workers (bench/fleet_worker.py) for `bench e2e --fleet N`.

Each one is enrolled as the autoscaler would enrol a machine: recorded as a pending instance of the pool
with a fresh activation token (through the store, under the leader's epoch), given a certificate of the
drivers' worker issuer, started with the token in its environment, and activated by the leading driver
when it calls in. Its pid goes in `corral up`'s pid files as `worker-NAME`, so the CPU accounting counts
it among the workers and `corral up` stops it if the benchmark does not.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

from bench.common import REPO_DIR, progress
from services.common.processes import PidFiles
from services.common.tls import WorkerIssuer
from services.db.database import Database, DatabaseConfig
from services.db.store import JobStore
from services.up.process import UpProcess

ACTIVATION_TIMEOUT_S = 60.0


async def _enrol(database_url: str, names: list[str], pool: str, cores_mcpu: int) -> dict[str, str]:
    """Record each worker as a pending instance of `pool`; their activation tokens by name."""
    db = await Database.connect(DatabaseConfig.from_url(database_url))
    try:
        epoch = int((await db.fetchone("SELECT epoch FROM leader_epoch", name="bench_fleet_epoch"))["epoch"])
        store, tokens = JobStore(db), {}
        for name in names:
            tokens[name] = secrets.token_hex(16)
            await store.create_instance(epoch, name, pool, cores_mcpu, tokens[name])
        return tokens
    finally:
        await db.close()


async def _active(database_url: str, names: list[str]) -> int:
    db = await Database.connect(DatabaseConfig.from_url(database_url))
    try:
        rows = await db.fetchall("SELECT name FROM instances WHERE state = 'active'", name="bench_fleet_active")
        return len({row["name"] for row in rows} & set(names))
    finally:
        await db.close()


@contextlib.contextmanager
def fleet(up: UpProcess, database_url: str, n: int, pool: str, cores_mcpu: int) -> Iterator[list[str]]:
    """Start `n` simulated workers of `cores_mcpu` each in `pool` and wait until every one is active; stop them
    (by pid: SIGTERM, then SIGKILL) on the way out."""
    names = [f"{pool}-fleet-{i}-{secrets.token_hex(2)}" for i in range(n)]
    tokens = asyncio.run(_enrol(database_url, names, pool, cores_mcpu))
    data, pid_files = up.data_dir, PidFiles(up.data_dir / "run" / "pids")
    drivers = up.endpoints.get("workers_gateway") or up.endpoints["drivers"]
    issuer = WorkerIssuer(data / "certs" / "driver")
    processes: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name in names:
            certs = data / "fleet-certs" / name
            issuer.provision_worker(name, certs)
            argv = [sys.executable, "-m", "bench.fleet_worker", "--instance-name", name, "--cores-mcpu",
                    str(cores_mcpu), "--driver-addresses", drivers, "--certs-dir", str(certs),
                    "--scratch-dir", str(data / "fleet" / name), "--log-root-url", f"file://{data / 'blobs'}"]
            with open(data / "logs" / f"fleet-{name}.log", "ab") as log:
                processes[name] = subprocess.Popen(
                    argv, cwd=REPO_DIR, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                    env={**up.env, "CORRAL_ACTIVATION_TOKEN": tokens[name]})
            pid_files.record(f"worker-{name}", processes[name].pid)
        deadline = time.monotonic() + ACTIVATION_TIMEOUT_S
        while (active := asyncio.run(_active(database_url, names))) < n:
            if gone := [name for name, p in processes.items() if p.poll() is not None]:
                raise RuntimeError(f"simulated workers exited: {gone} (logs in {data / 'logs'})")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{active} of {n} simulated workers active after {ACTIVATION_TIMEOUT_S} s")
            time.sleep(0.2)
        progress(f"fleet: {n} simulated workers of {cores_mcpu / 1000:g} cores active in {pool}")
        yield names
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for name, process in processes.items():
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            pid_files.forget(f"worker-{name}")
