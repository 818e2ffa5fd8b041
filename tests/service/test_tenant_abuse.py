"""Issue 33, part 4: one tenant's legal reads cannot take the API down for the others.

Real processes on a real MariaDB: auth and a frontend started as `python -m services.auth` and
`python -m services.frontend` (their default limits but those a test names), an abusive tenant
(tests/service/abusive_reader.py) as a process of its own, and the well-behaved tenant measured
from this one. Before the limits of docs/security.md (*Limits*, the rows "Requests per user",
"Reads running at once per user", "Submissions per user" and "Database connections for the health
probe"), sixteen threads of one user looping ListJobs with a 32-term query on a 100,000-job batch
made the frontend NOT_SERVING every 6 s (its health probe waited for the 10-connection pool the
reads held) and another user's GetBatch p99 was 5.5 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status

from corral.batch.v1 import batch_service_pb2 as bpb
from corral.batch.v1 import batch_service_pb2_grpc, job_spec_pb2
from services.auth.store import AuthStore
from services.common.tls import DevCertificateAuthority
from services.db.database import Database, DatabaseConfig
from services.db.server import server_pid
from services.db.store import JobStore
from tests.conftest import service_url

pytestmark = pytest.mark.timeout(600)

REPO_DIR = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 60.0
ABUSER_THREADS = 16
BATCH_JOBS = 100_000
INSERT_BUNCH = 5_000
GET_BATCH_CALLS = 200
GET_BATCH_SPACING_S = 0.05
"""Between two of the other tenant's calls: 200 of them span at least 10 s of the attack, five
periods of the frontend's health probe."""
P99_BOUND_MS = 1000.0
"""The other tenant's GetBatch p99 while one tenant abuses, as the suite holds it: ten times issue 33's 100 ms,
because the suite's other tests load the machine (docs/security.md, *Why 2 reads at once*: p99s of 211 to
384 ms at a load of 8 to 13). Without the limits every call ended DEADLINE_EXCEEDED at 10 s, so this still
fails on what it guards against. The p99 itself is printed (`-s`); its quiet-machine figures are in the docs."""
MEASURE_TIMEOUT_S = 90.0
"""The longest the measuring may take (today's code: calls of seconds each)."""
HEALTH_POLL_S = 0.2


@dataclasses.dataclass
class Process:
    """A process this test started (stopped by its pid)."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else "(no log)"

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()


@contextlib.contextmanager
def started(name: str, args: list[str], run_dir: Path) -> Iterator[tuple[Process, dict]]:
    """`python -m ARGS --ports-file F`; yields it and its ports once it has written them."""
    ports_file, log = run_dir / f"{name}.ports", run_dir / f"{name}.log"
    with open(log, "ab") as out:
        popen = subprocess.Popen([sys.executable, "-m", *args, "--ports-file", str(ports_file)], cwd=REPO_DIR,
                                 stdout=out, stderr=subprocess.STDOUT)
    process = Process(name, popen, log)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ports_file.exists():
            assert popen.poll() is None, f"{name} exited with {popen.returncode}:\n{process.tail()}"
            assert time.monotonic() < deadline, f"{name} did not start:\n{process.tail()}"
            time.sleep(0.05)
        yield process, json.loads(ports_file.read_text())
    finally:
        process.stop()


@dataclasses.dataclass
class Stack:
    """Auth and a frontend as processes, and what the tenants need to call it."""

    address: str
    ca_cert: Path
    certs: DevCertificateAuthority
    frontend: Process
    admin_db: Database
    tokens: dict[str, str]
    """alice abuses (billing project 'noisy'), bob behaves (billing project 'quiet')."""
    run_dir: Path

    def metadata(self, who: str) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.tokens[who]}"),)

    def channel(self) -> grpc.aio.Channel:
        return grpc.aio.secure_channel(self.address, grpc.ssl_channel_credentials(self.ca_cert.read_bytes()))


@contextlib.asynccontextmanager
async def stack(db_config: DatabaseConfig, tmp_path: Path, frontend_flags: list[str] = ()) -> AsyncIterator[Stack]:
    certs = DevCertificateAuthority(tmp_path / "certs").issue_services()
    admin_db = await Database.connect(db_config)
    try:
        people = AuthStore(admin_db)
        tokens = {}
        for name in ("alice", "bob"):
            await people.create_user(name)
            tokens[name] = (await people.create_token(name, "api"))[1]
        store = JobStore(admin_db)
        await store.create_billing_project("noisy", ["alice"])
        await store.create_billing_project("quiet", ["bob"])
        common = ["--certs-dir", str(certs.directory)]
        with started("auth", ["services.auth", "--database-url", service_url(db_config, "auth"), *common],
                     tmp_path) as (_, auth_ports), \
                started("frontend", ["services.frontend", "--database-url", service_url(db_config, "frontend"),
                                     *common, "--auth-address", f"localhost:{auth_ports['internal']}",
                                     "--spec-root-url", f"file://{tmp_path / 'blobs'}", *frontend_flags],
                        tmp_path) as (frontend, ports):
            yield Stack(f"localhost:{ports['public']}", certs.ca_cert_path, certs, frontend, admin_db, tokens,
                        tmp_path)
    finally:
        await admin_db.close()


async def large_batch(store: JobStore, user: str, project: str, n_jobs: int) -> int:
    """A committed batch of `n_jobs` jobs, each with the attribute name=sample-N, inserted through the
    real procedure in bunches (as bench/populate.py does)."""
    batch_id = int((await store.create_batch(user, project))["batch_id"])
    update = await store.create_update(batch_id, n_jobs)
    update_id, start = int(update["update_id"]), int(update["start_job_id"])
    limit = asyncio.Semaphore(4)

    async def insert(first: int) -> None:
        rows = [{"job_id": start + i, "job_group_id": 0, "cores_mcpu": 1000, "inst_coll": "standard",
                 "attributes": [{"key": "name", "value": f"sample-{i}"}]}
                for i in range(first, min(first + INSERT_BUNCH, n_jobs))]
        async with limit:
            await store.insert_jobs(batch_id, update_id, rows)

    await asyncio.gather(*(insert(first) for first in range(0, n_jobs, INSERT_BUNCH)))
    await store.commit_update(batch_id, update_id)
    return batch_id


def heavy_reads_running(db_config: DatabaseConfig) -> int:
    """How many of the abuser's list_jobs statements MariaDB is running now."""
    import pymysql

    connection = pymysql.connect(**db_config.connect_kwargs(with_database=False))
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT COUNT(*) FROM information_schema.PROCESSLIST"
                           " WHERE COMMAND = 'Query' AND ID <> CONNECTION_ID() AND INFO LIKE %s",
                           ("%LIKE%nowhere%",))
            return int(cursor.fetchone()[0])
    finally:
        connection.close()


@contextlib.contextmanager
def abuser(s: Stack, batch_id: int) -> Iterator[tuple[Path, int]]:
    """alice's sixteen threads (tests/service/abusive_reader.py) until the block ends; yields where
    their outcome will be (read it after the block) and the process's pid."""
    token_file, stop, out = s.run_dir / "alice.token", s.run_dir / "abuser.stop", s.run_dir / "abuser.json"
    token_file.write_text(s.tokens["alice"])
    token_file.chmod(0o600)
    with open(s.run_dir / "abuser.log", "ab") as log:
        popen = subprocess.Popen([sys.executable, "-m", "tests.service.abusive_reader", s.address,
                                  str(s.ca_cert), str(token_file), str(batch_id), str(ABUSER_THREADS), str(stop),
                                  str(out)], cwd=REPO_DIR, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield out, popen.pid
    finally:
        stop.touch()
        try:
            popen.wait(timeout=60)  # each thread ends after its call in flight (30 s at most)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()


def cpu_s(pid: int | None) -> float:
    """CPU time (user and system) process `pid` has used, from /proc."""
    if pid is None:
        return float("nan")
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


async def test_one_users_heavy_legal_reads_leave_another_users_get_batch_fast_and_the_frontend_serving(
        db_config: DatabaseConfig, tmp_path: Path) -> None:
    """docs/security.md, *What must not happen*: "one tenant's legal reads take the API down for the others"."""
    async with stack(db_config, tmp_path) as s:
        store = JobStore(s.admin_db)
        noisy = await large_batch(store, "alice", "noisy", BATCH_JOBS)
        async with s.channel() as channel:
            batches = batch_service_pb2_grpc.BatchServiceStub(channel)
            health = health_pb2_grpc.HealthStub(channel)
            spec = job_spec_pb2.JobSpec(image="busybox", argv=job_spec_pb2.Argv(args=["true"]))
            quiet = (await batches.SubmitBatch(bpb.SubmitBatchRequest(
                billing_project="quiet", jobs=[spec] * 10, idempotency_token=uuid.uuid4().hex),
                metadata=s.metadata("bob"))).batch.batch_id
            with abuser(s, noisy) as (outcome, abuser_pid):
                deadline = time.monotonic() + 60
                while heavy_reads_running(s.admin_db.config) < 1:  # the attack is on
                    assert time.monotonic() < deadline, "the abuser's reads never ran"
                    await asyncio.sleep(0.1)
                statuses: list[str] = []
                measuring = True

                async def watch_health() -> None:
                    while measuring:
                        try:
                            answer = await health.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
                            statuses.append(health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status))
                        except grpc.aio.AioRpcError as e:
                            statuses.append(e.code().name)
                        await asyncio.sleep(HEALTH_POLL_S)

                pids = {"frontend": s.frontend.popen.pid, "mariadb": server_pid(s.admin_db.config),
                        "abuser": abuser_pid}
                cpu_before, began_measuring = {k: cpu_s(pid) for k, pid in pids.items()}, time.monotonic()
                watcher = asyncio.create_task(watch_health())
                took_ms: list[float] = []
                failures: list[str] = []
                ends = time.monotonic() + MEASURE_TIMEOUT_S
                try:
                    for _ in range(GET_BATCH_CALLS):
                        if time.monotonic() > ends:
                            break
                        began = time.perf_counter()
                        try:
                            await batches.GetBatch(bpb.GetBatchRequest(batch_id=quiet), metadata=s.metadata("bob"),
                                                   timeout=10)
                            took_ms.append((time.perf_counter() - began) * 1000)
                        except grpc.aio.AioRpcError as e:
                            failures.append(e.code().name)
                            took_ms.append(float("inf"))
                        await asyncio.sleep(GET_BATCH_SPACING_S)
                finally:
                    measuring = False
                    await watcher
                running_at_end = heavy_reads_running(s.admin_db.config)
                cores = {k: (cpu_s(pid) - cpu_before[k]) / (time.monotonic() - began_measuring)
                         for k, pid in pids.items()}
        result = json.loads(outcome.read_text())
        counts = result["counts"]
        finite = [t for t in took_ms if t != float("inf")]
        report = (f"bob: {len(took_ms)} GetBatch, {len(failures)} failed {sorted(set(failures))}, "
                  f"p50 {percentile(finite or [0], 50):.1f} ms, p99 {percentile(took_ms, 99):.1f} ms, "
                  f"max {max(took_ms):.1f} ms; health {dict((x, statuses.count(x)) for x in set(statuses))}; "
                  f"alice: {counts}; heavy reads running at the end: {running_at_end}; cores used: "
                  f"{', '.join(f'{k} {v:.2f}' for k, v in cores.items())}; load {os.getloadavg()[0]:.1f}")
        print(report)
        assert failures == [], report
        assert len(took_ms) == GET_BATCH_CALLS, report
        assert percentile(took_ms, 99) < P99_BOUND_MS, report
        assert statuses and set(statuses) == {"SERVING"}, report
        assert counts.get("RESOURCE_EXHAUSTED", 0) > 0, report
        assert counts.get("RESOURCE_EXHAUSTED+RetryInfo", 0) > 0, report
        assert "max_concurrent_reads_per_user" in result["messages"]["RESOURCE_EXHAUSTED"] or \
            "max_requests_per_user_per_s" in result["messages"]["RESOURCE_EXHAUSTED"], report
