"""chaos: a steady mixed load while the other faults fire at random, for `--minutes`.

The load runs in threads, as several users would make it: batches of short
jobs (some a tree of dependencies), batches of long jobs that an update
then grows, batches cancelled while their jobs run, watchers that follow a
batch's events to its end, and a well-behaved user who reads a batch and
lists batches twice a second and times each call. Each submission that
fails is sent again with the same builder (its idempotency token), as a
user would after an error.

Meanwhile the faults fire in rounds: each round is every fault once, in an
order drawn from `--seed`, with a pause drawn between them; `--short` is one
round, the long version rounds until `--minutes` have passed. The faults:
the leader SIGKILLed, the leader SIGSTOPped until a standby leads, a worker
SIGKILLed, the frontend SIGKILLed, MariaDB SIGKILLed (`corral up` restarts
it), MariaDB SIGSTOPped for seconds, row locks held on the hot tables, and
(as root) a worker cut off the network for less or more than the heartbeat
deadline. Each waits until what it broke is back before the next.

At the end the load stops, every batch must complete, and it checks:
exactly once (faults/audit.py: nothing lost or recorded twice, the
invariant checker clean; cancelled batches may end in any final state),
each watcher saw every event once and in order and every job's final
change once, no call of the well-behaved user failed with INTERNAL or
UNKNOWN, and every submission got its one batch. It prints the p99 of the
well-behaved user's calls in each minute, the strikes and how long each
took to recover, and (faults/growth.py) each process's memory and open
descriptors: with `--out DIR`, their series and plot go there.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import corral
from corral.batch.v1 import job_state_pb2
from faults import Outcome
from faults.audit import audit
from faults.growth import MIB, Sampler, plot
from faults.partition import cut_off
from faults.slow_database import hold_locks
from faults.stack import Stack, batch, eventually, kill, progress

NAME = "chaos"
HELP = "a steady mixed load while the other faults fire at random (an hour; --short: each once)"

FINAL = {job_state_pb2.JOB_STATE_SUCCEEDED, job_state_pb2.JOB_STATE_FAILED, job_state_pb2.JOB_STATE_ERROR,
         job_state_pb2.JOB_STATE_CANCELLED}
RECOVERY_S = 120.0
"""How long a part a strike broke may take to be back before the strike counts as broken."""
CUTS_S = (8.0, 25.0)
"""How long a partition lasts: under the heartbeat deadline the faults give `corral up` (20 s: the worker's
session breaks and comes back), or past it (the worker is declared lost and its jobs run again). The short
version cuts only under it (the partition fault's short version cuts past it)."""
SUBMIT_TRIES = 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--minutes", type=float, default=60.0,
                        help="how long the faults fire (default %(default)s; --short: one round of each fault)")
    parser.add_argument("--seed", type=int, help="of the faults' order and the load (default: drawn and printed)")
    parser.add_argument("--gap", type=float, help="the longest pause between two faults, seconds (default 20; "
                                                  "4 with --short)")
    parser.add_argument("--out", type=Path, help="write the processes' memory and descriptor series "
                                                 "(chaos-growth.json) and their plot (chaos-growth.png) here")


# ------------------------------------------------------------------ the faults


def _new_leader(stack: Stack, epoch: int) -> None:
    eventually(lambda: (now := stack.leader()) is not None and now[0] > epoch, RECOVERY_S, 0.05, "a new leader")


def leader_kill(stack: Stack, rng: random.Random, short: bool) -> str:
    epoch, address, pid = eventually(stack.leader, RECOVERY_S, 0.1, "a leader")
    kill(pid)
    _new_leader(stack, epoch)
    return f"driver {address} (pid {pid}, epoch {epoch})"


def leader_pause(stack: Stack, rng: random.Random, short: bool) -> str:
    epoch, address, pid = eventually(stack.leader, RECOVERY_S, 0.1, "a leader")
    kill(pid, signal.SIGSTOP)
    try:
        _new_leader(stack, epoch)
        time.sleep(rng.uniform(0, 3))
    finally:
        kill(pid, signal.SIGCONT)
    return f"driver {address} (pid {pid}, epoch {epoch}) stopped until a standby led"


def worker_kill(stack: Stack, rng: random.Random, short: bool) -> str:
    workers = eventually(stack.worker_pids, RECOVERY_S, 0.2, "a live worker")
    name = rng.choice(sorted(workers))
    kill(workers[name])
    return f"worker {name} (pid {workers[name]})"


def _killed_and_back(stack: Stack, pid_of: Callable[[], int | None], what: str) -> int:
    """SIGKILL the process `pid_of` names; wait until `corral up` has started another and the API answers."""
    pid = eventually(pid_of, RECOVERY_S, 0.1, what)
    kill(pid)
    eventually(lambda: pid_of() not in (None, pid) and stack.api_answers(), RECOVERY_S, 0.2, f"{what} back")
    return pid


def frontend_kill(stack: Stack, rng: random.Random, short: bool) -> str:
    return f"frontend (pid {_killed_and_back(stack, stack.frontend_pid, 'the frontend')})"


def database_restart(stack: Stack, rng: random.Random, short: bool) -> str:
    return f"MariaDB (pid {_killed_and_back(stack, stack.mariadb_pid, 'MariaDB')}) killed"


def database_hang(stack: Stack, rng: random.Random, short: bool) -> str:
    pid = eventually(stack.mariadb_pid, RECOVERY_S, 0.2, "MariaDB")
    seconds = rng.uniform(2, 8)
    kill(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        kill(pid, signal.SIGCONT)
    return f"MariaDB (pid {pid}) stopped for {seconds:.1f} s"


def slow_database(stack: Stack, rng: random.Random, short: bool) -> str:
    rows = stack.query("SELECT MAX(batch_id) b FROM batches")
    batch_id = int(rows[0]["b"] or 0)
    seconds = rng.uniform(2, 6)
    hold_locks(stack, batch_id, seconds)
    return f"batch {batch_id}'s jobs and every instance locked for {seconds:.1f} s"


def partition(stack: Stack, rng: random.Random, short: bool) -> str:
    workers = eventually(stack.worker_pids, RECOVERY_S, 0.2, "a live worker")
    name = rng.choice(sorted(workers))
    cut_s = CUTS_S[0] if short else rng.choice(CUTS_S)
    with cut_off(workers[name]):
        time.sleep(cut_s)
    return f"worker {name} (pid {workers[name]}) cut off for {cut_s:g} s"


STRIKES: dict[str, Callable[[Stack, random.Random, bool], str]] = {
    "leader-kill": leader_kill, "paused-leader": leader_pause, "worker-kill": worker_kill,
    "frontend-kill": frontend_kill, "database-restart": database_restart, "database-hang": database_hang,
    "slow-database": slow_database, "partition": partition}
ROOT_ONLY = {"partition"}


def strikes_here() -> list[str]:
    """The faults this process can cause (a partition needs root: iptables and cgroups)."""
    return [name for name in STRIKES if name not in ROOT_ONLY or os.geteuid() == 0]


@dataclasses.dataclass
class Strike:
    name: str
    at_s: float
    took_s: float
    what: str


# ------------------------------------------------------------------ the load


@dataclasses.dataclass
class Watched:
    """What a watcher saw of one batch."""

    batch_id: int
    n_jobs: int
    problems: list[str] = dataclasses.field(default_factory=list)


class Load:
    """The users' work, in threads, until `stop()`; what it submitted and saw."""

    def __init__(self, stack: Stack, rng: random.Random, started: float):
        self._stack = stack
        self._rng = rng
        self._started = started
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.succeeding: list[int] = []
        """Batches whose every job must succeed."""
        self.cancelled: list[int] = []
        self.watched: list[Watched] = []
        self.resubmissions = 0
        self.problems: list[str] = []
        self.calls: list[tuple[float, float]] = []
        """The well-behaved user's calls: (seconds since the start, latency)."""
        self.call_failures: dict[str, int] = {}

    def start(self) -> None:
        for target in (self._submitting, self._reading):
            thread = threading.Thread(target=self._guarded(target), name=f"load-{target.__name__}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        """Stop submitting, then wait for what was begun: updates and cancels sent, watched batches ended."""
        self._stopping.set()
        for thread in self._threads[:2]:  # the submitter and the reader: nothing new is spawned after them
            thread.join()
        for thread in list(self._threads):
            thread.join()

    def _guarded(self, target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except Exception as e:  # noqa: BLE001 - a load thread that dies is a finding, not a crash
                with self._lock:
                    self.problems.append(f"{threading.current_thread().name}: {type(e).__name__}: {e}")
        return run

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=self._guarded(target), name=name, daemon=True)
        thread.start()
        with self._lock:
            self._threads.append(thread)

    def _until_accepted(self, what: str, call: Callable[[], int]) -> int:
        """`call` (a submission or an update) again and again, with the same builder, until it is accepted."""
        for n in range(SUBMIT_TRIES):
            try:
                return call()
            except corral.CorralError as e:
                progress(f"{NAME}: {what} refused ({e.code.name}); sending it again")
                with self._lock:
                    self.resubmissions += 1
                time.sleep(min(2.0 * (n + 1), 10.0))
        raise RuntimeError(f"{what} was refused {SUBMIT_TRIES} times")

    def _submitting(self) -> None:
        with self._stack.client() as client:
            n = 0
            while not self._stopping.wait(self._rng.uniform(1.0, 4.0)):
                n += 1
                kind = self._rng.choices(["short", "tree", "long", "cancelled"], [4, 2, 1, 1])[0]
                getattr(self, f"_{kind}")(client, n)

    def _short(self, client: corral.Client, n: int) -> None:
        builder = batch(f"chaos-short-{n}", self._rng.randint(10, 40), ["sleep", "0.5"])
        batch_id = self._until_accepted(f"batch chaos-short-{n}", lambda: client.submit(builder).batch_id)
        with self._lock:
            self.succeeding.append(batch_id)
        if self._rng.random() < 0.5:
            watched = Watched(batch_id, len(builder))
            with self._lock:
                self.watched.append(watched)
            self._spawn(lambda: self._watch(watched), f"watch-{batch_id}")

    def _tree(self, client: corral.Client, n: int) -> None:
        builder = corral.BatchBuilder("default", attributes={"name": f"chaos-tree-{n}"})
        jobs = []
        for i in range(self._rng.randint(7, 31)):
            parents = [jobs[(i - 1) // 2]] if i else []
            jobs.append(builder.job("busybox", ["sleep", "0.2"], cores=0.25, parents=parents))
        batch_id = self._until_accepted(f"batch chaos-tree-{n}", lambda: client.submit(builder).batch_id)
        watched = Watched(batch_id, len(jobs))
        with self._lock:
            self.succeeding.append(batch_id)
            self.watched.append(watched)
        self._spawn(lambda: self._watch(watched), f"watch-{batch_id}")

    def _long(self, client: corral.Client, n: int) -> None:
        builder = batch(f"chaos-long-{n}", 4, ["sleep", "15"])
        batch_id = self._until_accepted(f"batch chaos-long-{n}", lambda: client.submit(builder).batch_id)
        with self._lock:
            self.succeeding.append(batch_id)
        more = batch(f"chaos-long-{n}-update", 4, ["sleep", "1"])

        def update() -> None:
            time.sleep(self._rng.uniform(1, 5))
            with self._stack.client() as own:
                self._until_accepted(f"an update of batch {batch_id}",
                                     lambda: own.update(batch_id, more).update.update_id)
        self._spawn(update, f"update-{batch_id}")

    def _cancelled(self, client: corral.Client, n: int) -> None:
        builder = batch(f"chaos-cancelled-{n}", 20, ["sleep", "20"])
        batch_id = self._until_accepted(f"batch chaos-cancelled-{n}", lambda: client.submit(builder).batch_id)
        with self._lock:
            self.cancelled.append(batch_id)

        def cancel() -> None:
            time.sleep(self._rng.uniform(1, 6))
            with self._stack.client() as own:
                self._until_accepted(f"the cancel of batch {batch_id}",
                                     lambda: own.cancel_batch(batch_id, reason="chaos").batch_id)
        self._spawn(cancel, f"cancel-{batch_id}")

    def _watch(self, watched: Watched) -> None:
        """Follow the batch from its first event to `batch_completed`: ids in order, every job's end once."""
        ids, finals = [], {}
        with self._stack.client() as client:
            for event in client.watch(watched.batch_id, include_cost_events=True, max_reconnects=1000):
                ids.append(event.event_id)
                if event.HasField("job_state_changed") and event.job_state_changed.new_state in FINAL:
                    job_id = event.job_state_changed.job_id
                    finals[job_id] = finals.get(job_id, 0) + 1
                if event.HasField("batch_completed"):
                    break
        if ids != list(range(1, len(ids) + 1)):
            watched.problems.append(f"batch {watched.batch_id}: event ids not each once in order")
        if len(finals) != watched.n_jobs or any(n != 1 for n in finals.values()):
            twice = sorted(job for job, n in finals.items() if n != 1)
            watched.problems.append(f"batch {watched.batch_id}: {len(finals)} of {watched.n_jobs} jobs ended in "
                                    f"the stream, {twice} more than once")

    def _reading(self) -> None:
        """The well-behaved user: a batch and the first page of the list, twice a second, each call timed."""
        with self._stack.client() as client:
            while not self._stopping.wait(0.5):
                with self._lock:
                    known = self.succeeding[-1] if self.succeeding else None
                calls: list[Callable[[], object]] = [lambda: next(iter(client.list_batches(page_size=5)), None)]
                if known is not None:
                    calls.append(lambda: client.get_batch(known))
                for call in calls:
                    began = time.monotonic()
                    try:
                        call()
                    except corral.CorralError as e:
                        with self._lock:
                            self.call_failures[e.code.name] = self.call_failures.get(e.code.name, 0) + 1
                    with self._lock:
                        self.calls.append((began - self._started, time.monotonic() - began))


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else float("nan")


# ------------------------------------------------------------------ the program


def inject(stack: Stack, args: argparse.Namespace) -> Outcome:
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    rng = random.Random(seed)
    gap_s = args.gap or (4.0 if args.short else 20.0)
    outcome = Outcome()
    outcome.figure(f"{NAME}.seed", seed, "(--seed to run the same faults again)")
    sampler = Sampler(stack, 1.0 if args.short else 5.0)
    sampler.start()
    started = time.monotonic()
    load = Load(stack, random.Random(rng.random()), started)
    load.start()
    strikes: list[Strike] = []
    names = strikes_here()
    try:
        while not outcome.broken:
            order = rng.sample(names, len(names))
            for name in order:
                time.sleep(rng.uniform(gap_s / 4, gap_s))
                at = time.monotonic()
                progress(f"{NAME}: {name} at {at - started:.0f} s")
                try:
                    what = STRIKES[name](stack, rng, args.short)
                except TimeoutError as e:
                    outcome.broken.append(f"{name} at {at - started:.0f} s: {e}")
                    break
                strikes.append(Strike(name, round(at - started, 1), round(time.monotonic() - at, 2), what))
                progress(f"{NAME}: {name}: {what}; back after {strikes[-1].took_s:.1f} s")
            if args.short or time.monotonic() - started > args.minutes * 60:
                break
    finally:
        load.stop()
    loaded_s = time.monotonic() - started
    batch_ids = load.succeeding + load.cancelled
    try:
        drained = stack.wait_complete(batch_ids, timeout_s=600)
        outcome.figure(f"{NAME}.drained_after_load", drained, "s")
    except TimeoutError as e:
        outcome.broken.append(str(e))
    sampler.stop()
    _report(outcome, args, strikes, load, sampler, loaded_s)
    outcome.audit = audit(stack, load.succeeding)
    ended = audit(stack, load.cancelled, expect_success=False)
    outcome.figure(f"{NAME}.cancelled_batches", len(load.cancelled), f"({ended.jobs} jobs: {ended.by_state})")
    if not ended.ok:
        outcome.broken.append("the cancelled batches: " + "; ".join(ended.lines()))
    return outcome


def _report(outcome: Outcome, args: argparse.Namespace, strikes: list[Strike], load: Load, sampler: Sampler,
            loaded_s: float) -> None:
    outcome.figure(f"{NAME}.minutes", loaded_s / 60, "under load")
    outcome.figure(f"{NAME}.strikes", len(strikes), ", ".join(sorted({s.name for s in strikes})))
    for name in sorted({s.name for s in strikes}):
        took = [s.took_s for s in strikes if s.name == name]
        outcome.figure(f"{NAME}.{name}.back_after.max", max(took), f"s (of {len(took)})")
    outcome.figure(f"{NAME}.batches", len(load.succeeding), "whose jobs must all succeed")
    outcome.figure(f"{NAME}.resubmissions", load.resubmissions, "submissions, updates and cancels sent again")
    outcome.figure(f"{NAME}.watchers", len(load.watched), "batches followed to their end")
    for watched in load.watched:
        outcome.broken.extend(watched.problems)
    outcome.broken.extend(load.problems)
    by_minute: dict[int, list[float]] = {}
    for at, latency in load.calls:
        by_minute.setdefault(int(at // 60), []).append(latency)
    for minute, latencies in sorted(by_minute.items()):
        outcome.figure(f"{NAME}.user.p99.minute_{minute + 1}", p99(latencies) * 1000, f"ms ({len(latencies)} calls)")
    outcome.figure(f"{NAME}.user.calls", len(load.calls), f"failed: {load.call_failures or 'none'}")
    if bad := {code: n for code, n in load.call_failures.items() if code in ("INTERNAL", "UNKNOWN")}:
        outcome.broken.append(f"the well-behaved user's calls failed with {bad}")
    lasting = sampler.lasting(0.5)
    for series in lasting:
        name = series.name if [s.name for s in lasting].count(series.name) == 1 else f"{series.name}-{series.pid}"
        outcome.figure(f"{NAME}.growth.{name.replace(' ', '.')}.rss", series.rss_bytes[-1] / MIB,
                       f"MiB at the end ({series.rss_growth_mib_per_h():+.1f} MiB/h over the second half; "
                       f"{series.fds[-1]} fds, {series.fd_growth_per_h():+.1f}/h)")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        sampler.save(args.out / "chaos-growth.json")
        with contextlib.suppress(ImportError):
            plot(list(sampler.series.values()), args.out / "chaos-growth.png",
                 f"corral up under chaos: {loaded_s / 60:.0f} minutes, {len(strikes)} faults")
