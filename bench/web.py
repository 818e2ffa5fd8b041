"""web: how long the web UI's pages take at the server, for a user with many batches and large batches.

Auth, a frontend (each user's quotas lifted, as bench/stack.py does) and the web (services.web, plain HTTP on
loopback) run in this process on a fresh schema, with a development CA. One user, `scientist` (a person with
a password, member of the project `lab`), gets:

- `--batches` batches of one Ready job each (default 10,000), made through the stored procedures
  (`JobStore`: create_batch, create_update, insert_jobs, commit_update; several connections at once): the
  fastest correct path, skipping only the frontend's gRPC hop and the specs of jobs nobody opens;
- one batch of `--big-jobs` jobs with dependencies (default 100,000), submitted as a user does, with the
  client's bunches (`corral.aio.Client.submit`);
- one batch of `--dag-jobs` jobs with dependencies (default 10,000), submitted the same way, whose every job
  then gets one attempt on one of 50 instances through the driver's procedures, layer by layer
  (schedule_jobs, mark_jobs_started, mark_jobs_complete, release_children, in calls of many jobs), so that
  its timeline has a bar per job: every layer succeeded but the last, still running.

Both DAGs are bench/web_drawing.py's pipeline: a setup job fans out to samples of four chained steps, every
50 samples (a cohort, a job group of its own) fan in to a gather with two reports, and a final job fans in
from every gather.

Then `scientist` and an administrator sign in through the web (the sign-in form and its nonce, the session
cookie kept by hand), and each page is asked for `--repeats` times, one request at a time. Per page: the
p50, p95 and max of `Server-Timing: app;dur=` (the web's own time: its gRPC calls to the frontend and the
frontend's SQL included, the network to the browser not), the p50 of the client's wall time, and the
response's size. The drawings are read once cold (every job read, Graphviz run) and then warm (kept by the
web until the batch's next event), and reported apart. The table goes to stderr, the figures to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import html
import random
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from bench.common import BenchContext, fresh_database, percentile, positive_int, progress
from bench.stack import certificate_authority, work_dir
from bench.web_drawing import pipeline
from corral import aio
from corral.builder import BatchBuilder, JobGroupHandle, JobHandle
from services.auth.app import AuthConfig
from services.auth.app import start as start_auth
from services.auth.store import AuthStore
from services.db.database import Database
from services.db.store import JobStore
from services.frontend.app import FrontendConfig
from services.frontend.app import start as start_frontend
from services.frontend.limits import Limits
from services.web import sessions
from services.web.app import make_app
from services.web.backend import Backend

NAME = "web"
HELP = "the web UI's pages at the server (Server-Timing) for 10,000 batches and batches of 100,000 and 10,000 jobs"

DEFAULT_BATCHES, SMOKE_BATCHES = 10_000, 50
DEFAULT_BIG_JOBS, SMOKE_BIG_JOBS = 100_000, 500
DEFAULT_DAG_JOBS, SMOKE_DAG_JOBS = 10_000, 200
DEFAULT_REPEATS, SMOKE_REPEATS = 20, 2
USER, PROJECT, ADMIN = "scientist", "lab", "root"
PASSWORDS = {USER: "scientist-password-1", ADMIN: "root-password-22"}
N_INSTANCES = 50
INSTANCE_CORES_MCPU = 1_000_000
SEED_CONNECTIONS = 8
"""Batches made at once while seeding."""
CALL_JOBS = 500
"""Jobs per schedule/start/complete call while giving the DAG's jobs their attempts."""
LAYER_MS = 15 * 60 * 1000
"""How far apart the DAG's layers start (the timeline's spread)."""
QUOTAS_LIFTED = Limits(max_requests_per_user_per_s=1e6, max_request_burst_per_user=1_000_000,
                       max_concurrent_reads_per_user=1_000, max_submissions_per_user_per_minute=1_000_000)
"""Each user's share of the frontend lifted, as bench/stack.py's flags do: one user's pages are measured, not
the share that would make them wait."""
PAGES = ("batches", "batches_running", "batches_page2", "big", "big_ready", "big_job", "dag", "dag_job",
         "dag_svg_cold", "dag_svg_warm", "timeline_svg_cold", "timeline_svg_warm", "billing", "admin")
"""Every page measured, in order; `_cold` ones once, the rest `--repeats` times."""
STATS = ("p50", "p95", "max", "wall_p50", "bytes")
_SERVER_TIMING = re.compile(r"app;dur=([0-9.]+)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batches", type=positive_int, metavar="N",
                        help=f"the user's batches (default {DEFAULT_BATCHES:,}; {SMOKE_BATCHES} with --smoke)")
    parser.add_argument("--big-jobs", type=positive_int, metavar="N",
                        help=f"jobs of the big batch (default {DEFAULT_BIG_JOBS:,}; {SMOKE_BIG_JOBS} with --smoke)")
    parser.add_argument("--dag-jobs", type=positive_int, metavar="N",
                        help=f"jobs of the batch with attempts (default {DEFAULT_DAG_JOBS:,}; {SMOKE_DAG_JOBS} "
                             "with --smoke)")
    parser.add_argument("--repeats", type=positive_int, metavar="N",
                        help=f"requests per page (default {DEFAULT_REPEATS}; {SMOKE_REPEATS} with --smoke)")


def figure_names() -> list[str]:
    """Every figure a run prints, in order."""
    return [f"{NAME}.{page}.{stat}" for page in PAGES for stat in STATS]


@dataclasses.dataclass(frozen=True)
class Sizes:
    batches: int
    big_jobs: int
    dag_jobs: int
    repeats: int

    @classmethod
    def of(cls, args: argparse.Namespace, smoke: bool) -> Sizes:
        return cls(args.batches or (SMOKE_BATCHES if smoke else DEFAULT_BATCHES),
                   args.big_jobs or (SMOKE_BIG_JOBS if smoke else DEFAULT_BIG_JOBS),
                   args.dag_jobs or (SMOKE_DAG_JOBS if smoke else DEFAULT_DAG_JOBS),
                   args.repeats or (SMOKE_REPEATS if smoke else DEFAULT_REPEATS))


# -- the services ---------------------------------------------------------


@contextlib.asynccontextmanager
async def web_stack(db: Database, root: Path) -> AsyncIterator[tuple[str, str, Path]]:
    """Auth, a frontend and the web in this process on `db`'s schema; (the web's base URL, the frontend's
    address, the CA's certificate)."""
    certs = certificate_authority(root)
    url = db.config.to_url()
    auth = await start_auth(AuthConfig(url, certs.directory))
    try:
        frontend = await start_frontend(FrontendConfig(url, certs.directory, f"localhost:{auth.internal_port}",
                                                       f"file://{root / 'blobs'}", limits=QUOTAS_LIFTED))
        try:
            frontend_address = f"localhost:{frontend.public_port}"
            backend = Backend(frontend_address, f"localhost:{auth.public_port}", certs.ca_cert_path, None)
            runner = web.AppRunner(make_app(backend), access_log=None)
            await runner.setup()
            try:
                site = web.TCPSite(runner, "127.0.0.1", 0)
                await site.start()
                port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
                yield f"http://127.0.0.1:{port}", frontend_address, certs.ca_cert_path
            finally:
                await runner.cleanup()
                await backend.close()
        finally:
            await frontend.stop()
    finally:
        await auth.stop()


# -- seeding --------------------------------------------------------------


async def seed_batches(store: JobStore, n_batches: int) -> None:
    """`n_batches` committed batches of one Ready job each, SEED_CONNECTIONS at a time."""
    started = time.perf_counter()
    numbers = iter(range(n_batches))

    async def worker() -> None:
        for i in numbers:
            batch_id = int((await store.create_batch(USER, PROJECT, attributes={
                "name": f"sample {i:05d}", "pipeline": "align" if i % 2 else "call"}))["batch_id"])
            update = await store.create_update(batch_id, 1)
            await store.insert_jobs(batch_id, int(update["update_id"]), [
                {"job_id": int(update["start_job_id"]), "job_group_id": 0, "cores_mcpu": 1000,
                 "inst_coll": "standard"}])
            await store.commit_update(batch_id, int(update["update_id"]))
            if (i + 1) % 1000 == 0:
                progress(f"  {i + 1:,} batches ({time.perf_counter() - started:.0f} s)")

    await asyncio.gather(*(worker() for _ in range(SEED_CONNECTIONS)))
    progress(f"{NAME}: {n_batches:,} batches in {time.perf_counter() - started:.1f} s")


def pipeline_builder(n_jobs: int, name: str) -> BatchBuilder:
    """bench/web_drawing.py's pipeline of about `n_jobs` jobs as no-op jobs with those dependencies, each
    cohort of 50 samples in a job group of its own (setup and final in the root group)."""
    batch = BatchBuilder(PROJECT, attributes={"name": name})
    handles: dict[int, JobHandle] = {}
    cohorts: dict[int, JobGroupHandle] = {}
    for node in pipeline(n_jobs):
        group = None
        if node.group_id:
            group = cohorts.get(node.group_id)
            if group is None:
                group = cohorts[node.group_id] = batch.job_group(attributes={"name": f"cohort {node.group_id}"})
        handles[node.job_id] = batch.job("busybox", ["true"], attributes={"name": node.name},
                                         parents=[handles[p] for p in node.parents], job_group=group)
    return batch


async def submit_pipeline(client: aio.Client, n_jobs: int, name: str) -> tuple[int, int]:
    """The pipeline submitted with the client's bunches; (batch id, its number of jobs)."""
    started = time.perf_counter()
    batch = pipeline_builder(n_jobs, name)
    submitted = await client.submit(batch)
    progress(f"{NAME}: batch {submitted.batch_id} of {len(batch):,} jobs with dependencies submitted in "
             f"{time.perf_counter() - started:.1f} s")
    return submitted.batch_id, len(batch)


async def give_attempts(db: Database, store: JobStore, batch_id: int) -> int:
    """Run the batch's jobs layer by layer on N_INSTANCES instances through the driver's procedures: each
    layer's Ready jobs scheduled, started and completed (Success) in calls of CALL_JOBS jobs, their children
    released; the last layer is left running. Returns the jobs given an attempt."""
    started = time.perf_counter()
    epoch = await store.elect_leader("bench-web")
    instances = [f"bench-web-{i:02d}" for i in range(N_INSTANCES)]
    for name in instances:
        await store.create_instance(epoch, name, "standard", INSTANCE_CORES_MCPU, f"token-{name}")
        await store.activate_instance(epoch, name, f"token-{name}")
    rng = random.Random(3)
    base_ms = store.clock_ms() - 8 * LAYER_MS  # the pipeline has 7 layers
    n_attempts, layer = 0, 0
    while True:
        ready = [int(row["job_id"]) for row in await db.fetchall(
            "SELECT job_id FROM jobs WHERE batch_id = %s AND state = 'Ready' ORDER BY job_id", (batch_id,))]
        if not ready:
            break
        pending = await db.fetchone("SELECT COUNT(*) AS n FROM jobs WHERE batch_id = %s AND state = 'Pending'",
                                    (batch_id,))
        last = pending is None or int(pending["n"]) == 0
        for first in range(0, len(ready), CALL_JOBS):
            rows = [{"batch_id": batch_id, "job_id": job_id, "attempt_id": f"a{job_id}",
                     "instance_name": instances[job_id % N_INSTANCES]} for job_id in ready[first:first + CALL_JOBS]]
            outcomes = await store.schedule_jobs(epoch, None, rows)
            if any(o["outcome"] != "scheduled" for o in outcomes):
                raise RuntimeError(f"schedule_jobs refused: {outcomes[:3]}")
            starts = {row["job_id"]: base_ms + layer * LAYER_MS + rng.randrange(LAYER_MS // 3) for row in rows}
            if last:  # the running layer started within the last minutes
                starts = {job_id: store.clock_ms() - rng.randrange(5 * 60 * 1000) for job_id in starts}
            # Each row names its instance, which overrides the call's.
            await store.mark_jobs_started(epoch, instances[0], [{**row, "start_time_ms": starts[row["job_id"]]}
                                                                for row in rows])
            if not last:
                await store.mark_jobs_complete(epoch, None, [
                    {**row, "state": "Success", "exit_code": 0, "start_time_ms": starts[row["job_id"]],
                     "end_time_ms": starts[row["job_id"]] + 60_000 + rng.randrange(LAYER_MS // 2)} for row in rows])
        n_attempts += len(ready)
        if last:
            break
        while int((await store.release_children(epoch, 5000, 1000))["n_children"]):
            pass
        layer += 1
    progress(f"{NAME}: {n_attempts:,} attempts in {layer + 1} layers on {N_INSTANCES} instances in "
             f"{time.perf_counter() - started:.1f} s")
    return n_attempts


# -- the browser ----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Answer:
    status: int
    text: str
    server_ms: float
    wall_ms: float
    n_bytes: int
    summary: str
    """A drawing's summary for people (its X-Corral-Summary), else empty."""


class Browser:
    """A client that keeps the cookies the web sets by hand (they are Secure, and this is plain HTTP)."""

    def __init__(self, session: aiohttp.ClientSession, base: str):
        self._session = session
        self._base = base
        self.cookies: dict[str, str] = {}

    async def request(self, method: str, path: str, data: dict[str, str] | None = None) -> Answer:
        headers = {"Cookie": "; ".join(f"{k}={v}" for k, v in self.cookies.items())} if self.cookies else {}
        began = time.perf_counter()
        async with self._session.request(method, self._base + path, data=data, headers=headers,
                                         allow_redirects=False) as response:
            body = await response.read()
            wall_ms = (time.perf_counter() - began) * 1000
            for header in response.headers.getall("Set-Cookie", []):
                name, _, rest = header.partition("=")
                value = rest.split(";", 1)[0]
                if value in ("", '""') or "Max-Age=0" in header:
                    self.cookies.pop(name, None)
                else:
                    self.cookies[name] = value
            timing = _SERVER_TIMING.search(response.headers.get("Server-Timing", ""))
            if timing is None:
                raise RuntimeError(f"{method} {path}: no Server-Timing")
            return Answer(response.status, body.decode(errors="replace"), float(timing.group(1)), wall_ms,
                          len(body), response.headers.get("X-Corral-Summary", ""))

    async def sign_in(self, username: str) -> None:
        form = await self.request("GET", "/login")
        nonce = re.search(r'name="nonce" value="([^"]+)"', form.text)
        if nonce is None:
            raise RuntimeError("no nonce on the sign-in page")
        answer = await self.request("POST", "/login", {"username": username, "password": PASSWORDS[username],
                                                       "nonce": nonce.group(1)})
        if answer.status != 303 or sessions.SESSION_COOKIE not in self.cookies:
            raise RuntimeError(f"{username} could not sign in: {answer.status} {answer.text[:300]}")


@dataclasses.dataclass
class Measured:
    server_ms: list[float] = dataclasses.field(default_factory=list)
    wall_ms: list[float] = dataclasses.field(default_factory=list)
    n_bytes: int = 0
    summary: str = ""


async def measure(browser: Browser, path: str, repeats: int) -> tuple[Measured, str]:
    """`path` asked for `repeats` times; what it took, and the last page's text."""
    measured = Measured()
    text = ""
    for _ in range(repeats):
        answer = await browser.request("GET", path)
        if answer.status != 200:
            raise RuntimeError(f"GET {path}: {answer.status} {answer.text[:300]}")
        measured.server_ms.append(answer.server_ms)
        measured.wall_ms.append(answer.wall_ms)
        measured.n_bytes, measured.summary, text = answer.n_bytes, answer.summary, answer.text
    return measured, text


# -- the run --------------------------------------------------------------


async def run(ctx: BenchContext, args: argparse.Namespace) -> dict[str, Any]:
    sizes = Sizes.of(args, ctx.smoke)
    measured: dict[str, Measured] = {}
    paths: dict[str, str] = {}
    with work_dir() as root:
        async with fresh_database(ctx.server, pool_size=SEED_CONNECTIONS + 2) as db, \
                web_stack(db, root) as (base, frontend_address, ca_cert):
            auth = AuthStore(db)
            store = JobStore(db)
            await auth.create_user(USER, password=PASSWORDS[USER])
            _, token = await auth.create_token(USER, "api", name="bench")
            await auth.ensure_admin(ADMIN, password=PASSWORDS[ADMIN])
            await store.create_billing_project(PROJECT, [USER])

            progress(f"{NAME}: seeding {sizes.batches:,} batches, one of {sizes.big_jobs:,} jobs and one of "
                     f"{sizes.dag_jobs:,} jobs with attempts")
            await seed_batches(store, sizes.batches)
            async with aio.Client(frontend_address, token, ca_cert=ca_cert) as client:
                big, n_big = await submit_pipeline(client, sizes.big_jobs, "big pipeline")
                dag, n_dag = await submit_pipeline(client, sizes.dag_jobs, "pipeline with attempts")
            n_attempts = await give_attempts(db, store, dag)

            async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:
                user, admin = Browser(http, base), Browser(http, base)
                await user.sign_in(USER)
                await admin.sign_in(ADMIN)
                first, text = await measure(user, "/batches", sizes.repeats)
                found = re.search(r'rel="next" href="([^"]+)"', text)
                if found is None:
                    raise RuntimeError("the first page of batches links no next page")
                paths = {"batches": "/batches", "batches_running": "/batches?q=state%3Drunning",
                         "batches_page2": html.unescape(found.group(1)), "big": f"/batches/{big}",
                         "big_ready": f"/batches/{big}?jobs=state%3Dready",
                         "big_job": f"/batches/{big}/jobs/{n_big // 2}", "dag": f"/batches/{dag}",
                         "dag_job": f"/batches/{dag}/jobs/2", "dag_svg_cold": f"/batches/{dag}/dag.svg",
                         "dag_svg_warm": f"/batches/{dag}/dag.svg", "timeline_svg_cold": f"/batches/{dag}/timeline.svg",
                         "timeline_svg_warm": f"/batches/{dag}/timeline.svg", "billing": "/billing", "admin": "/admin"}
                measured["batches"] = first
                progress("  batches: /batches done")
                for page in PAGES[1:]:
                    browser = admin if page == "admin" else user
                    measured[page], _ = await measure(browser, paths[page],
                                                      1 if page.endswith("_cold") else sizes.repeats)
                    progress(f"  {page}: {paths[page]} done")

    progress(f"\n{'page':<20} {'p50':>8} {'p95':>8} {'max':>8} {'wall p50':>9} {'bytes':>9}   (ms, server-side)")
    for page in PAGES:
        m = measured[page]
        figures = (percentile(m.server_ms, 50), percentile(m.server_ms, 95), max(m.server_ms),
                   percentile(m.wall_ms, 50))
        progress(f"{page:<20} " + " ".join(f"{v:8.1f}" for v in figures[:3]) + f" {figures[3]:9.1f} {m.n_bytes:9,}")
    progress("")
    for page in PAGES:
        m = measured[page]
        ctx.figures.add(f"{NAME}.{page}.p50", round(percentile(m.server_ms, 50), 1), "ms")
        ctx.figures.add(f"{NAME}.{page}.p95", round(percentile(m.server_ms, 95), 1), "ms")
        ctx.figures.add(f"{NAME}.{page}.max", round(max(m.server_ms), 1), "ms")
        ctx.figures.add(f"{NAME}.{page}.wall_p50", round(percentile(m.wall_ms, 50), 1), "ms")
        ctx.figures.add(f"{NAME}.{page}.bytes", m.n_bytes, "bytes")
    return {"smoke": ctx.smoke, "n_batches": sizes.batches, "n_big_jobs": n_big, "n_dag_jobs": n_dag,
            "n_attempts": n_attempts, "n_instances": N_INSTANCES, "repeats": sizes.repeats, "paths": paths,
            "batches_seeded_by": "JobStore procedures (create_batch, create_update, insert_jobs, commit_update), "
                                 f"{SEED_CONNECTIONS} at once",
            "big_and_dag_submitted_by": "corral.aio.Client.submit (bunches) through the frontend",
            "services": "auth, frontend (quotas lifted) and web in the benchmark's process; TLS between them, "
                        "plain HTTP to the web",
            "drawing_summaries": {page: m.summary for page, m in measured.items() if m.summary},
            "samples": {page: {"server_ms": m.server_ms, "wall_ms": m.wall_ms} for page, m in measured.items()}}
