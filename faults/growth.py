"""What each process of a `corral up` holds over time: its resident memory
and its open file descriptors, read from /proc every few seconds while a
fault program runs, then measured for growth and drawn.

A process is one of the deployment's when its command line names the data
directory (`corral up` itself, each service, MariaDB, the gateways, the
registry); what runs below a worker (its keeper, the runtime, the jobs) is
the worker's business and not sampled. A service restarted by a fault is a
new series under the same name. Growth is measured over the second half of
a series (the first is warm-up: pools filling, imports, caches), as a
least-squares slope.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import threading
import time
from pathlib import Path

from faults.stack import Stack

PAGE = os.sysconf("SC_PAGE_SIZE")
MIB = 1 << 20
WORKER = "worker"


@dataclasses.dataclass
class Series:
    """One process's readings."""

    name: str
    pid: int
    times_s: list[float] = dataclasses.field(default_factory=list)
    """Seconds since sampling began."""
    rss_bytes: list[int] = dataclasses.field(default_factory=list)
    fds: list[int] = dataclasses.field(default_factory=list)

    @property
    def span_s(self) -> float:
        return self.times_s[-1] - self.times_s[0] if self.times_s else 0.0

    def second_half(self) -> tuple[list[float], list[int], list[int]]:
        middle = self.times_s[0] + self.span_s / 2 if self.times_s else 0.0
        kept = [i for i, t in enumerate(self.times_s) if t >= middle]
        return [self.times_s[i] for i in kept], [self.rss_bytes[i] for i in kept], [self.fds[i] for i in kept]

    def rss_growth_mib_per_h(self) -> float:
        """The slope of resident memory over the second half of the series, MiB per hour."""
        times, rss, _ = self.second_half()
        return slope(times, rss) * 3600 / MIB

    def fd_growth_per_h(self) -> float:
        times, _, fds = self.second_half()
        return slope(times, fds) * 3600


def slope(xs: list[float], ys: list[int]) -> float:
    """The least-squares slope of ys over xs (0 for fewer than two distinct xs)."""
    n = len(xs)
    if n < 2:
        return 0.0
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    spread = sum((x - mean_x) ** 2 for x in xs)
    return 0.0 if spread == 0 else sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / spread


def _argv(pid: int) -> list[str]:
    with contextlib.suppress(OSError):
        return [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    return []


def _parent(pid: int) -> int:
    with contextlib.suppress(OSError, IndexError, ValueError):
        return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
    return 0


def name_of(argv: list[str]) -> str:
    """What a deployment's process is called: a worker by its instance ('worker NAME'), a service by its
    ports file (as its log is), `corral up` so, anything else by its program."""
    if "--instance-name" in argv[:-1]:
        return f"{WORKER} {argv[argv.index('--instance-name') + 1]}"
    if "--ports-file" in argv[:-1]:
        return Path(argv[argv.index("--ports-file") + 1]).stem
    if argv[1:4] == ["-m", "corral.cli", "up"]:
        return "corral up"
    return Path(argv[0]).name if argv else "?"


def kind_of(name: str) -> str:
    """What a plot labels the process by: every worker as one."""
    return WORKER if name.startswith(f"{WORKER} ") else name


def deployment_processes(data_dir: Path, worker_pids: set[int]) -> dict[int, str]:
    """pid -> name of the live processes whose command line names `data_dir`, but those below a worker."""
    data = str(data_dir)
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        argv = _argv(int(entry))
        if not any(data in arg for arg in argv):
            continue
        pid, ancestor, below_worker = int(entry), _parent(int(entry)), False
        while ancestor > 1:
            if ancestor in worker_pids:
                below_worker = True
                break
            ancestor = _parent(ancestor)
        if not below_worker:
            found[pid] = name_of(argv)
    return found


def reading(pid: int) -> tuple[int, int] | None:
    """(resident bytes, open descriptors) of `pid`, or None if it is gone."""
    try:
        rss_pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
        return rss_pages * PAGE, len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, IndexError, ValueError):
        return None


class Sampler(threading.Thread):
    """Reads the deployment's processes every `interval_s` until `stop()`."""

    def __init__(self, stack: Stack, interval_s: float):
        super().__init__(name="growth-sampler", daemon=True)
        self._stack = stack
        self._interval_s = interval_s
        self._stopped = threading.Event()
        self._began = time.monotonic()
        self.series: dict[int, Series] = {}

    def run(self) -> None:
        while not self._stopped.is_set():
            self.sample()
            self._stopped.wait(self._interval_s)

    def sample(self) -> None:
        now = time.monotonic() - self._began
        workers = set(self._stack.worker_pids().values())
        for pid, name in deployment_processes(self._stack.data_dir, workers).items():
            if (read := reading(pid)) is None:
                continue
            series = self.series.setdefault(pid, Series(name, pid))
            series.times_s.append(round(now, 2))
            series.rss_bytes.append(read[0])
            series.fds.append(read[1])

    def stop(self) -> None:
        self._stopped.set()
        self.join()

    def lasting(self, fraction: float) -> list[Series]:
        """The series that span at least `fraction` of the sampling, by name: what growth can be read from."""
        if not self.series:
            return []
        whole = max(s.times_s[-1] for s in self.series.values() if s.times_s)
        return sorted((s for s in self.series.values() if s.span_s >= fraction * whole), key=lambda s: s.name)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps([dataclasses.asdict(s) for s in self.series.values()]))


def plot(series: list[Series], path: Path, title: str) -> None:
    """Resident memory and open descriptors of each series over time, one line each, into a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = sorted({kind_of(s.name) for s in series})
    colours = {kind: plt.get_cmap("tab20")(i % 20) for i, kind in enumerate(kinds)}
    figure, (memory, descriptors) = plt.subplots(2, 1, figsize=(11, 8), sharex=True)
    labelled: set[str] = set()
    for s in sorted(series, key=lambda s: (s.name, s.times_s[0] if s.times_s else 0)):
        kind = kind_of(s.name)
        minutes = [t / 60 for t in s.times_s]
        label = None if kind in labelled else kind
        labelled.add(kind)
        memory.plot(minutes, [b / MIB for b in s.rss_bytes], color=colours[kind], label=label, linewidth=1)
        descriptors.plot(minutes, s.fds, color=colours[kind], linewidth=1)
    memory.set_ylabel("resident memory, MiB")
    memory.set_yscale("log")
    descriptors.set_ylabel("open file descriptors")
    descriptors.set_yscale("log")
    descriptors.set_xlabel("minutes")
    memory.set_title(title)
    memory.legend(loc="center left", bbox_to_anchor=(1.01, 0), fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
