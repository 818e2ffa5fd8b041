"""job-start: what it costs the worker's machine to start a job's process.

N no-op attempts (`true`, reserving memory like the scheduler's jobs do)
go through the real `ProcessRuntime.run`, as the worker calls it: the
attempt's directories made, its uid claimed, its command started, watched,
reaped, its directories removed. Twice: **isolated** (as a worker running as
root does: a uid and namespaces of its own; skipped when not root) and
**unisolated** (as a `--unisolated-dev` worker does: a plain child process).

  one at a time  the CPU of each start (p50, p90): the whole machine's work
                 for it, in this process (the worker's part), the job's
                 processes and any helper process the runtime keeps; and
                 its wall time, from the call to the outcome;
  K at once      starts/s with K attempts running at once, and the mean CPU
                 per start.

CPU is read from a cgroup of the benchmark's own (cgroup v1 `cpuacct.usage`
or v2 `cpu.stat`, in ns or µs), which every process the benchmark starts
joins, exited ones included. Without one (not root) it falls back to
rusage of this process and its reaped children plus `/proc` of the live
ones, whose clock ticks (10 ms) make single starts coarse.

A third mode, **oci**, starts `busybox true` containers through the real
OCI runtime as a worker does (bench/oci_start.py: a loopback registry, the
worker's image cache, runc, the public bridge; root and runc needed, else
skipped). Its CPU adds what the attempts' own cgroups used (the container's
processes, outside the benchmark's cgroup). One at a time, it also times
each step of an attempt and splits each start's CPU between the worker's
process, its children (the keeper and runc) and the container.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench import oci_start
from bench.common import BenchContext, percentile, positive_int, progress
from bench.starter import Starter
from services.worker import runtime as runtime_module
from services.worker.runtime import ProcessRuntime, ProcessRuntimeConfig, can_isolate

NAME = "job-start"
HELP = "CPU and rate of starting no-op attempts: the process runtime, isolated and not, and OCI containers"

DEFAULT_STARTS, SMOKE_STARTS = 500, 10
DEFAULT_CONCURRENCY = 16
DEFAULT_MEMORY_MIB = 1024
WARM_UP = 5
MODES = ("isolated", "unisolated", "oci")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--starts", type=positive_int, metavar="N",
                        help=f"attempts per mode and phase (default {DEFAULT_STARTS}; {SMOKE_STARTS} with --smoke)")
    parser.add_argument("--concurrency", type=positive_int, default=DEFAULT_CONCURRENCY, metavar="K",
                        help="attempts running at once in the second phase (default: %(default)s)")
    parser.add_argument("--modes", default=",".join(MODES), type=_modes, metavar="M,M",
                        help="which modes, of %(default)s (each runs where the machine can)")
    parser.add_argument("--memory-mib", type=int, default=DEFAULT_MEMORY_MIB, metavar="MIB",
                        help="memory each attempt reserves, i.e. its RLIMIT_AS (0: none; default: %(default)s)")


def figure_names(modes: tuple[str, ...] = MODES) -> list[str]:
    """Every figure a run prints, in order."""
    return [f"{NAME}.{mode}.{what}" for mode in modes
            for what in ("cpu_ms.p50", "cpu_ms.p90", "wall_ms.p50", "starts_per_s", "concurrent_cpu_ms")]


class CpuMeter:
    """CPU time of this process and every process it starts, in ms, from a cgroup of its own."""

    def __init__(self) -> None:
        self._cgroup: Path | None = None
        self._read_ms = self._rusage_ms
        self._home: Path | None = None

    @contextlib.contextmanager
    def running(self) -> Iterator[CpuMeter]:
        """Join a fresh cgroup for the duration (root only); without one, count what rusage and /proc tell."""
        try:
            self._enter_cgroup()
        except OSError as e:
            progress(f"no cgroup of our own ({e}); CPU per start from rusage and /proc, in 10 ms ticks")
        try:
            yield self
        finally:
            if self._cgroup is not None and self._home is not None:
                (self._home / "cgroup.procs").write_text(str(os.getpid()))
                self._cgroup.rmdir()

    def read_ms(self) -> float:
        """CPU used so far by this process and every process it started (ms)."""
        return self._read_ms()

    @property
    def source(self) -> str:
        """Where the figures come from: "cgroup" (exact) or "rusage+proc" (10 ms ticks for live processes)."""
        return "cgroup" if self._cgroup is not None else "rusage+proc"

    def _enter_cgroup(self) -> None:
        memberships = dict(line.split(":", 2)[1:] for line in Path("/proc/self/cgroup").read_text().splitlines())
        v1 = next((path for controllers, path in memberships.items() if "cpuacct" in controllers.split(",")), None)
        if v1 is not None and Path("/sys/fs/cgroup/cpuacct/cpuacct.usage").exists():
            root = Path("/sys/fs/cgroup/cpuacct")
            home, reader = v1, self._cgroup_v1_ms
        elif "" in memberships and Path("/sys/fs/cgroup/cgroup.controllers").exists():
            root, home, reader = Path("/sys/fs/cgroup"), memberships[""], self._cgroup_v2_ms
        else:
            raise OSError("neither cgroup v1 cpuacct nor cgroup v2 is mounted at /sys/fs/cgroup")
        self._home = root / home.lstrip("/")
        cgroup = self._home / f"corral-bench-job-start-{os.getpid()}"
        cgroup.mkdir()
        try:
            (cgroup / "cgroup.procs").write_text(str(os.getpid()))
        except OSError:
            cgroup.rmdir()
            raise
        self._cgroup = cgroup
        self._read_ms = reader

    def _cgroup_v1_ms(self) -> float:
        assert self._cgroup is not None
        return int((self._cgroup / "cpuacct.usage").read_text()) / 1e6

    def _cgroup_v2_ms(self) -> float:
        assert self._cgroup is not None
        stat = dict(line.split() for line in (self._cgroup / "cpu.stat").read_text().splitlines())
        return int(stat["usage_usec"]) / 1e3

    @staticmethod
    def _rusage_ms() -> float:
        used = 0.0
        for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
            usage = resource.getrusage(who)
            used += usage.ru_utime + usage.ru_stime
        ticks = os.sysconf("SC_CLK_TCK")
        for pid in _live_descendants(os.getpid()):
            with contextlib.suppress(OSError):
                fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
                used += sum(int(f) for f in fields[11:15]) / ticks  # utime stime cutime cstime
        return used * 1000


def _live_descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()[1])
                children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


async def measure(mode: str, meter: CpuMeter, n_starts: int, concurrency: int, memory_bytes: int,
                  scratch: Path) -> dict[str, Any]:
    if mode == "oci":
        async with oci_start.oci_starter(scratch, memory_bytes) as oci:
            return await _measure(mode, oci, meter, n_starts, concurrency)
    runtime = ProcessRuntime(ProcessRuntimeConfig(allow_unisolated=True))
    try:
        return await _measure(mode, Starter(runtime, scratch, memory_bytes), meter, n_starts, concurrency)
    finally:
        await runtime.close()


async def _measure(mode: str, starter: Starter, meter: CpuMeter, n_starts: int,
                   concurrency: int) -> dict[str, Any]:
    def cpu_ms() -> float:
        return meter.read_ms() + starter.container_cpu_ms()

    for _ in range(WARM_UP):
        await starter.start_one()
    cpu_ms_each, wall_ms, split = [], [], CpuSplit()
    clock = oci_start.StepClock()
    with clock.installed() if mode == "oci" else contextlib.nullcontext():
        for _ in range(n_starts):
            cpu_before, wall_before = cpu_ms(), time.perf_counter()
            with split.counting(starter):
                await starter.start_one()
            wall_ms.append((time.perf_counter() - wall_before) * 1000)
            cpu_ms_each.append(cpu_ms() - cpu_before)
    progress(f"{mode}: {n_starts} starts one at a time: CPU p50 {percentile(cpu_ms_each, 50):.2f} ms")

    pending = iter(range(n_starts))

    async def lane() -> None:
        for _ in pending:
            await starter.start_one()

    cpu_before, wall_before = cpu_ms(), time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(concurrency)))
    elapsed_s = time.perf_counter() - wall_before
    concurrent_cpu_ms = (cpu_ms() - cpu_before) / n_starts
    measured: dict[str, Any] = {
        "cpu_ms.p50": round(percentile(cpu_ms_each, 50), 2), "cpu_ms.p90": round(percentile(cpu_ms_each, 90), 2),
        "wall_ms.p50": round(percentile(wall_ms, 50), 2), "starts_per_s": round(n_starts / elapsed_s, 1),
        "concurrent_cpu_ms": round(concurrent_cpu_ms, 2), "cpu_ms_split.p50": split.p50_ms()}
    if mode == "oci":
        measured["step_wall_ms.p50"] = steps = clock.p50_ms()
        progress(f"{mode}: one at a time, p50 per step: " + ", ".join(f"{k.strip()} {v:g} ms"
                                                                      for k, v in steps.items()))
    progress(f"{mode}: CPU p50 per start by part: " + ", ".join(f"{k} {v:g} ms" for k, v in split.p50_ms().items()))
    return measured


class CpuSplit:
    """Each start's CPU by part: this process (the worker's side), its reaped children outside the container
    (the keeper, runc and `ip`; for the process runtime unisolated, the job's processes; not the isolated
    mode's job launcher, which lives on: what the parts leave of an isolated start's CPU is its), and the
    container's cgroup (the job's processes and runc's init)."""

    def __init__(self) -> None:
        self.parts: dict[str, list[float]] = {"worker process": [], "reaped children": [], "container": []}

    @contextlib.contextmanager
    def counting(self, starter: Starter) -> Iterator[None]:
        before = (_rusage_ms(resource.RUSAGE_SELF), _rusage_ms(resource.RUSAGE_CHILDREN), starter.container_cpu_ms())
        yield
        after = (_rusage_ms(resource.RUSAGE_SELF), _rusage_ms(resource.RUSAGE_CHILDREN), starter.container_cpu_ms())
        own, children, container = (a - b for a, b in zip(after, before))
        # The container's first process is the keeper's child, reaped by it: its CPU is in the keeper's
        # rusage of its children, and so in ours, as well as in the container's cgroup.
        for calls, used in zip(self.parts.values(), (own, max(0.0, children - container), container)):
            calls.append(used)

    def p50_ms(self) -> dict[str, float]:
        return {part: round(percentile(calls, 50), 2) for part, calls in self.parts.items()}


def _rusage_ms(who: int) -> float:
    usage = resource.getrusage(who)
    return (usage.ru_utime + usage.ru_stime) * 1000


async def run(ctx: BenchContext, args: argparse.Namespace) -> dict[str, Any]:
    n_starts = args.starts or (SMOKE_STARTS if ctx.smoke else DEFAULT_STARTS)
    memory_bytes = max(0, args.memory_mib) * 2**20
    modes = tuple(mode for mode in args.modes if _can_run(mode))
    measured = {}
    with CpuMeter().running() as meter, tempfile.TemporaryDirectory(prefix="corral-job-start-") as scratch:
        for mode in modes:
            # Unisolated is what a worker that is not root runs (the tests force it the same way).
            saved = runtime_module.can_isolate
            if mode == "unisolated":
                runtime_module.can_isolate = lambda: False
            try:
                measured[mode] = await measure(mode, meter, n_starts, args.concurrency, memory_bytes,
                                               Path(scratch) / mode)
            finally:
                runtime_module.can_isolate = saved
    for name in figure_names(modes):
        mode, what = name.split(".", 2)[1:]
        unit = "starts/s" if what == "starts_per_s" else "ms"
        ctx.figures.add(name, measured[mode][what], unit)
    return {"n_starts": n_starts, "concurrency": args.concurrency, "memory_bytes": memory_bytes,
            "modes": list(modes), "smoke": ctx.smoke, "cpu_source": meter.source,
            "cpu_ms_split_p50": {mode: measured[mode]["cpu_ms_split.p50"] for mode in modes},
            "oci_step_wall_ms_p50": measured["oci"]["step_wall_ms.p50"] if "oci" in measured else None}


def _modes(text: str) -> tuple[str, ...]:
    modes = tuple(mode.strip() for mode in text.split(",") if mode.strip())
    if not modes or set(modes) - set(MODES):
        raise argparse.ArgumentTypeError(f"{text!r}: modes are some of {', '.join(MODES)}")
    return tuple(mode for mode in MODES if mode in modes)


def _can_run(mode: str) -> bool:
    why_not = {"isolated": "" if can_isolate() else "not root on Linux",
               "oci": oci_start.why_not()}.get(mode, "")
    if why_not:
        progress(f"the {mode} mode is skipped: {why_not}")
    return not why_not
