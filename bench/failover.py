"""failover: how long a paused, killed or stopped leader keeps corral from working, and what it costs.

Issue 10's experiment on real processes: three drivers (`python -m
services.driver`, the first leading) and N workers (`python -m
services.worker`), each running one long job. The leader is frozen with
SIGSTOP for `--pause` seconds (30 in the issue), then resumed with SIGCONT.
Figures, in seconds from the SIGSTOP:

- `takeover_s`: a standby leads (the epoch moved on: the paused leader's
  lease ran out by the database's clock);
- `workers_attached_s`: every worker has reported to the new leader (a
  heartbeat recorded since its election: the paused one, fenced, can record
  none);

and, once the old leader is resumed:

- `resumed_stands_by_s`: from the SIGCONT, the old leader says it does not
  lead and names the new one;
- `resumed_stale_writes`: how often its log says the database refused a
  call of its as stale (calls in flight when it was frozen; its loops
  start no new ones once its lease may have run out);

then the new leader is killed (SIGKILL): its database connection closes
with it, and a standby takes its lease over without waiting for it to run
out:

- `killed_takeover_s`, `killed_workers_attached_s`: from the SIGKILL,
  another driver leads, and every worker has reported to it;

then a clean shutdown (SIGTERM) of that leader, which gives its lease up:

- `handover_s`, `handover_workers_attached_s`: from the SIGTERM, the last
  driver leads, and every worker has reported to it;

and what the whole thing cost: `attempts_rerun` (attempts started beyond
the first of each job: an attempt killed and run again) and
`workers_declared_dead`; both should be 0.

Defaults are the shipped settings (lease 10 s renewed every second,
heartbeats every 5 s, a worker gives up on a silent driver after 10 s).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc

from bench.common import REPO_DIR, BenchContext, fresh_database, positive_int, progress
from bench.stack import Service, certificate_authority, service, work_dir
from corral.batch.v1 import job_spec_pb2
from corral.driver.v1 import driver_service_pb2 as pb
from corral.driver.v1 import driver_service_pb2_grpc
from services.common.tls import DevCertificateAuthority, WorkerIssuer
from services.db.database import Database
from services.db.store import JobStore
from services.driver.leader import LeaseSettings
from services.common.specs import SpecStore
from services.worker.runtime import can_isolate

NAME = "failover"
HELP = ("a leader paused with SIGSTOP, killed, stopped: time to a new leader and to every worker following it "
        "(real processes)")

DEFAULT_WORKERS, SMOKE_WORKERS = 4, 2
DEFAULT_PAUSE_S, SMOKE_PAUSE_S = 30.0, 0.0
SMOKE_LEASE = LeaseSettings(lease_s=2.0, renew_s=0.2)
SMOKE_HEARTBEAT_S, SMOKE_SILENCE_S = 0.5, 1.5
POLL_S = 0.05
SETTLE_S = 2.0
"""After the resumed leader stands by: time for the calls it had in flight to reach the database."""
DRIVERS = ("a", "b", "c")
"""One leader and two standbys: one for each of the paused and the killed leader to hand over to."""
WAIT_S = 120.0
"""The longest any step may take before the benchmark gives up."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=positive_int, metavar="N",
                        help=f"worker processes, one running job each (default {DEFAULT_WORKERS}; "
                             f"{SMOKE_WORKERS} with --smoke)")
    parser.add_argument("--pause", type=float, metavar="S",
                        help=f"how long the leader stays stopped (default {DEFAULT_PAUSE_S:g}, as in the issue; "
                             "with --smoke: only until the workers follow the new leader)")
    parser.add_argument("--lease", type=float, metavar="S",
                        help=f"the drivers' --leader-lease (default {LeaseSettings.lease_s:g}; "
                             f"{SMOKE_LEASE.lease_s:g} with --smoke)")
    parser.add_argument("--renew", type=float, metavar="S",
                        help=f"the drivers' --leader-renew-interval (default {LeaseSettings.renew_s:g}; "
                             f"{SMOKE_LEASE.renew_s:g} with --smoke)")


def figure_names() -> list[str]:
    """The names of every figure a run prints, in order."""
    return [f"{NAME}.{n}" for n in ("takeover_s", "workers_attached_s", "resumed_stands_by_s",
                                     "resumed_stale_writes", "killed_takeover_s", "killed_workers_attached_s",
                                     "handover_s", "handover_workers_attached_s",
                                     "attempts_rerun", "workers_declared_dead")]


async def until(what: str, check: Callable[[], Awaitable[Any]], alive: Callable[[], None] = lambda: None) -> Any:
    """Poll `check` until it returns something truthy; fail after WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while not (value := await check()):
        alive()
        if time.monotonic() > deadline:
            raise RuntimeError(f"{NAME}: {what} did not happen within {WAIT_S:g} s")
        await asyncio.sleep(POLL_S)
    return value


async def leader_row(db: Database) -> dict[str, Any]:
    row = await db.fetchone("SELECT epoch, leader_name, elected_at_ms FROM leader_epoch", name="bench_leader")
    assert row is not None
    return row


async def all_reported_since(db: Database, since_ms: int) -> bool:
    """Every active worker has a heartbeat recorded at or after `since_ms` (the leader's election)."""
    row = await db.fetchone("SELECT COUNT(*) AS n FROM instances WHERE state = 'active' AND "
                            "COALESCE(last_heartbeat_ms, 0) < %s", (since_ms,), name="bench_unreported")
    return row is not None and int(row["n"]) == 0


async def get_leader(certs: DevCertificateAuthority, address: str) -> pb.GetLeaderResponse | None:
    async with grpc.aio.secure_channel(address, certs.issue("frontend").channel_credentials()) as channel:
        try:
            return await driver_service_pb2_grpc.DriverServiceStub(channel).GetLeader(pb.GetLeaderRequest(),
                                                                                     timeout=1)
        except grpc.aio.AioRpcError:
            return None


@contextlib.contextmanager
def worker_processes(env: dict[str, str], certs: DevCertificateAuthority, root: Path,
                     names: list[str], drivers: str, silence_s: float | None) -> Iterator[list[subprocess.Popen[bytes]]]:
    """`python -m services.worker` per instance name (activation tokens `activate-<name>`); stopped by pid."""
    processes = []
    try:
        for name in names:
            certs_dir = WorkerIssuer(certs.directory).provision_worker(name, root / "worker-certs" / name).key.parent
            with open(root / f"{name}.log", "ab") as log:
                processes.append(subprocess.Popen(
                    [sys.executable, "-m", "services.worker", "--instance-name", name, "--cores-mcpu", "1000",
                     "--driver-addresses", drivers, "--certs-dir", str(certs_dir),
                     "--scratch-dir", str(root / "scratch" / name), "--log-root-url", f"file://{root / 'blobs'}",
                     *(["--driver-silence", str(silence_s)] if silence_s is not None else []),
                     *([] if can_isolate() else ["--unisolated-dev"])],
                    cwd=REPO_DIR, stdout=log, stderr=subprocess.STDOUT,
                    env={**env, "CORRAL_ACTIVATION_TOKEN": f"activate-{name}"}))
        yield processes
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


async def run(ctx: BenchContext, args: argparse.Namespace) -> dict[str, Any]:
    n_workers = args.workers or (SMOKE_WORKERS if ctx.smoke else DEFAULT_WORKERS)
    base = SMOKE_LEASE if ctx.smoke else LeaseSettings()
    lease = LeaseSettings(args.lease or base.lease_s, args.renew or base.renew_s)
    pause_s = args.pause if args.pause is not None else (SMOKE_PAUSE_S if ctx.smoke else DEFAULT_PAUSE_S)
    session = ["--heartbeat-interval", str(SMOKE_HEARTBEAT_S)] if ctx.smoke else []
    silence_s = SMOKE_SILENCE_S if ctx.smoke else None
    figures: dict[str, float] = {}
    with work_dir() as root:
        async with fresh_database(ctx.server, pool_size=4) as db:
            store = JobStore(db)
            await store.create_billing_project("bench", ["bench"])
            await db.execute("UPDATE instance_collections SET max_instances = 0", name="bench_no_autoscaling")
            certs = certificate_authority(root)
            driver_args = ["services.driver", "--database-url", db.config.to_url(), "--certs-dir",
                           str(certs.directory), "--spec-root-url", f"file://{root / 'blobs'}",
                           "--leader-lease", str(lease.lease_s), "--leader-renew-interval", str(lease.renew_s),
                           *session]
            with contextlib.ExitStack() as stack:
                drivers: dict[str, Service] = {}
                addresses: dict[str, str] = {}
                try:
                    for name in DRIVERS:
                        driver, ports = stack.enter_context(
                            service(f"driver-{name}", [*driver_args, "--data-dir", str(root / name)], root))
                        drivers[name], addresses[name] = driver, f"localhost:{ports['internal']}"
                        if name == DRIVERS[0]:  # the first leads
                            elected = await until("driver-a leading", lambda: _led_by(db, addresses["a"]))
                    await _measure(ctx, db, store, certs, root, drivers, addresses, int(elected["epoch"]),
                                   n_workers, pause_s, silence_s, figures)
                finally:
                    for driver in drivers.values():  # never leave a stopped process behind
                        with contextlib.suppress(ProcessLookupError):
                            driver.process.send_signal(signal.SIGCONT)
    for name in figure_names():
        value = figures[name.removeprefix(f"{NAME}.")]
        ctx.figures.add(name, round(value, 2), "s" if name.endswith("_s") else "count")
    return {
        "workers": n_workers,
        "pause_s": pause_s,
        "lease_s": lease.lease_s,
        "renew_s": lease.renew_s,
        "heartbeat_interval_s": SMOKE_HEARTBEAT_S if ctx.smoke else "the driver's default",
        "driver_silence_s": silence_s or "the worker's default",
        "poll_s": POLL_S,
        "smoke": ctx.smoke,
        "server": "given by --database-url" if args.database_url else "private MariaDB, durable settings",
    }


async def _led_by(db: Database, address: str) -> dict[str, Any] | None:
    row = await leader_row(db)
    return row if row["leader_name"] == address else None


async def _led_after(db: Database, epoch: int) -> dict[str, Any] | None:
    """The leader's row once an epoch after `epoch` leads."""
    row = await leader_row(db)
    return row if int(row["epoch"]) > epoch else None


async def _measure(ctx: BenchContext, db: Database, store: JobStore, certs: DevCertificateAuthority, root: Path,
                   drivers: dict[str, Service], addresses: dict[str, str], epoch: int, n_workers: int,
                   pause_s: float, silence_s: float | None, figures: dict[str, float]) -> None:
    by_address = {address: name for name, address in addresses.items()}
    killed: set[str] = set()
    names = [f"w{i}" for i in range(n_workers)]
    for name in names:
        await store.create_instance(epoch, name, "standard", 1000, f"activate-{name}")
    env = {k: v for k, v in os.environ.items() if k != "CORRAL_DATABASE_URL"}
    with worker_processes(env, certs, root, names, ",".join(addresses.values()), silence_s) as workers:
        def alive() -> None:
            for process in [*(d.process for n, d in drivers.items() if n not in killed), *workers]:
                if process.poll() is not None:
                    raise RuntimeError(f"{NAME}: a process exited with {process.returncode} (logs in {root})")

        async def next_leader(what: str, since_epoch: int, since: float, prefix: str) -> tuple[str, int]:
            """Wait for an epoch after `since_epoch`, then for every worker to report to its leader."""
            led = await until(what, lambda: _led_after(db, since_epoch), alive)
            figures[f"{prefix}takeover_s" if prefix else "takeover_s"] = time.monotonic() - since
            await until(f"every worker following {led['leader_name']}",
                        lambda: all_reported_since(db, int(led["elected_at_ms"])), alive)
            figures[f"{prefix}workers_attached_s"] = time.monotonic() - since
            return by_address[led["leader_name"]], int(led["epoch"])

        refs = await SpecStore(f"file://{root / 'blobs'}").write_bunch(
            1, 1, 1, [job_spec_pb2.JobSpec(image="docker.io/library/busybox:1.36", script="sleep 100000")] * n_workers)
        batch_id = int((await store.create_batch("bench", "bench"))["batch_id"])
        update = await store.create_update(batch_id, n_workers)
        start = int(update["start_job_id"])
        await store.insert_jobs(batch_id, update["update_id"], [
            {"job_id": start + i, "spec_ref": ref, "cores_mcpu": 1000, "inst_coll": "standard", "job_group_id": 0}
            for i, ref in enumerate(refs)])
        await store.commit_update(batch_id, update["update_id"])

        async def all_started() -> bool:
            row = await db.fetchone("SELECT COUNT(*) AS n FROM attempts WHERE batch_id = %s AND "
                                    "start_time_ms IS NOT NULL", (batch_id,), name="bench_started")
            return row is not None and int(row["n"]) == n_workers

        progress(f"{NAME}: {n_workers} workers running a job each under driver-a; pausing it")
        await until("every job running", all_started, alive)

        first = drivers["a"]
        stopped = time.monotonic()
        os.kill(first.pid, signal.SIGSTOP)
        leader, epoch = await next_leader("a standby leading", epoch, stopped, "")
        progress(f"{NAME}: driver-{leader} led after {figures['takeover_s']:.2f} s, every worker followed after "
                 f"{figures['workers_attached_s']:.2f} s")
        await asyncio.sleep(max(0.0, stopped + pause_s - time.monotonic()))

        stale_before = first.log_path.read_text(errors="replace").count("stale leader epoch")
        resumed = time.monotonic()
        os.kill(first.pid, signal.SIGCONT)

        async def stands_by() -> bool:
            answer = await get_leader(certs, addresses["a"])
            return answer is not None and not answer.is_leader and answer.leader_address == addresses[leader]

        await until("driver-a standing by", stands_by, alive)
        figures["resumed_stands_by_s"] = time.monotonic() - resumed
        await asyncio.sleep(SETTLE_S)
        figures["resumed_stale_writes"] = first.log_path.read_text(errors="replace").count(
            "stale leader epoch") - stale_before

        killing = time.monotonic()
        killed.add(leader)
        os.kill(drivers[leader].pid, signal.SIGKILL)
        leader, epoch = await next_leader(f"a standby leading after driver-{leader}'s death", epoch, killing, "killed_")
        progress(f"{NAME}: killed, driver-{leader} led after {figures['killed_takeover_s']:.2f} s")

        handing = time.monotonic()
        os.kill(drivers[leader].pid, signal.SIGTERM)  # its exit is waited for on the way out
        killed.add(leader)
        await next_leader("the last driver leading", epoch, handing, "handover_")
        figures["handover_s"] = figures.pop("handover_takeover_s")

        row = await db.fetchone("SELECT COUNT(*) AS n FROM attempts WHERE batch_id = %s", (batch_id,))
        figures["attempts_rerun"] = int(row["n"]) - n_workers if row is not None else -1
        row = await db.fetchone("SELECT COUNT(*) AS n FROM instances WHERE deactivation_reason = 'missed heartbeats'")
        figures["workers_declared_dead"] = int(row["n"]) if row is not None else -1
