"""partition: one worker cut off from everything, for longer than the heartbeat deadline, then healed.

A batch of one-second jobs runs on two local workers. The program cuts the
worker running the most attempts off the network: every TCP connection it
has (its session with the driver, its own listener) is dropped both ways
by iptables rules on its ports, and the worker is moved into a cgroup whose
new connections iptables drops (`-m cgroup --path`), so it cannot connect
again either. Its processes keep running; only packets are lost, as in a
real partition. After `--cut` seconds (longer than the deadline `corral up`
is given, 20 s) the rules go and the worker may talk again.

It checks that the batch completes with every job succeeded and nothing
lost or recorded twice: the cut worker's attempts end as lost with it, their
jobs run again elsewhere as new attempts, and whatever the old worker says
late (a completion of an attempt it was still running) is refused, never
a second committed run of a job. It prints how many attempts the cut
stranded and how long the batch took after the heal. Needs root (iptables,
cgroups) on Linux.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from faults import Outcome
from faults.audit import audit
from faults.stack import Stack, eventually, progress

NAME = "partition"
HELP = "a worker cut off the network for longer than the heartbeat deadline, then healed"
NEEDS_ROOT = True

CGROUP_ROOT = Path("/sys/fs/cgroup/unified")
"""The cgroup v2 hierarchy iptables' cgroup match reads (on a pure cgroup v2 host: /sys/fs/cgroup)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=int, help="one-second jobs in the batch (default 1,000; 150 with --short)")
    parser.add_argument("--cut", type=float, help="seconds the worker is cut off (default 60; 35 with --short)")


def _cgroup_root() -> Path:
    return CGROUP_ROOT if (CGROUP_ROOT / "cgroup.procs").exists() else Path("/sys/fs/cgroup")


def _tcp_ports(pid: int) -> set[int]:
    """The local TCP ports of every socket `pid` has open (listening or connected)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[len("socket:["):-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                fields = line.split()
                if fields[9] in inodes:
                    ports.add(int(fields[1].rpartition(":")[2], 16))
    return ports


def _iptables(*args: str) -> None:
    subprocess.run(["iptables", "-w", *args], check=True, capture_output=True)


@contextlib.contextmanager
def cut_off(pid: int) -> Iterator[set[int]]:
    """Drop every packet of `pid`'s TCP connections, and its new ones, until the block ends; yields the ports."""
    cgroup = _cgroup_root() / f"corral-partition-{uuid.uuid4().hex[:8]}"
    cgroup.mkdir()
    rules: list[tuple[str, ...]] = [("OUTPUT", "-o", "lo", "-m", "cgroup", "--path", cgroup.name, "-j", "DROP")]
    try:
        (cgroup / "cgroup.procs").write_text(str(pid))  # its new sockets are the cgroup's
        ports = _tcp_ports(pid)
        for port in sorted(ports):
            rules += [("INPUT", "-i", "lo", "-p", "tcp", "--dport", str(port), "-j", "DROP"),
                      ("OUTPUT", "-o", "lo", "-p", "tcp", "--sport", str(port), "-j", "DROP")]
        for rule in rules:
            _iptables("-I", *rule)
        yield ports
    finally:
        for rule in rules:
            with contextlib.suppress(subprocess.CalledProcessError):
                _iptables("-D", *rule)
        with contextlib.suppress(OSError):
            for moved in (cgroup / "cgroup.procs").read_text().split():
                (cgroup.parent / "cgroup.procs").write_text(moved)
        with contextlib.suppress(OSError):
            cgroup.rmdir()


def inject(stack: Stack, args: argparse.Namespace) -> Outcome:
    n_jobs = args.jobs or (150 if args.short else 1000)
    cut_s = args.cut or (35.0 if args.short else 60.0)
    outcome = Outcome()
    batch_id = stack.submit("fault-partition", n_jobs, ["sleep", "1"])

    def busiest() -> tuple[str, int] | None:
        rows = stack.query("SELECT instance_name, COUNT(*) n FROM attempts WHERE batch_id = %s AND end_time_ms IS NULL "
                           "GROUP BY instance_name ORDER BY n DESC", (batch_id,))
        workers = stack.worker_pids()
        if len(rows) < 2 or rows[0]["instance_name"] not in workers:
            return None  # wait for two workers to run jobs: the cut one's must go somewhere
        return rows[0]["instance_name"], workers[rows[0]["instance_name"]]

    name, pid = eventually(busiest, 180, 0.5, "two workers running jobs")
    with cut_off(pid) as ports:
        stranded = int(stack.query("SELECT COUNT(*) n FROM attempts WHERE batch_id = %s AND instance_name = %s "
                                   "AND end_time_ms IS NULL", (batch_id, name))[0]["n"])
        progress(f"{NAME}: worker {name} (pid {pid}, ports {sorted(ports)}) cut off for {cut_s:g} s, "
                 f"running {stranded} attempts")
        time.sleep(cut_s)
    healed = time.monotonic()
    progress(f"{NAME}: healed")
    outcome.figure(f"{NAME}.cut", cut_s, "s")
    outcome.figure(f"{NAME}.stranded_attempts", stranded, "")
    try:
        stack.wait_complete([batch_id], timeout_s=300 + n_jobs)
        outcome.figure(f"{NAME}.complete_after_heal", time.monotonic() - healed, "s")
    except TimeoutError as e:
        outcome.broken.append(str(e))
    lost = stack.lost_attempts(batch_id, name)
    outcome.figure(f"{NAME}.worker_lost_attempts", lost, "of the cut worker")
    if stranded and not lost:
        outcome.broken.append(f"the cut worker's {stranded} attempts were never declared lost")
    outcome.audit = audit(stack, [batch_id])
    return outcome
