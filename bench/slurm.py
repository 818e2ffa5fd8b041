"""A private single-node Slurm on loopback, for comparing corral with it (bench/slurm_compare.py).

Debian's slurm-wlm and munge (scripts/setup.sh --for test installs them; the system services are not used): a
munged with its own key and socket, a slurmctld and a slurmd in the foreground, on ports other than
Slurm's defaults and bound to 127.0.0.1 only, with every file under one directory. Each daemon is
stopped by its pid on the way out.

Completion is read from Slurm's own job-completion log (jobcomp/filetxt: a line per finished job), so
timing a batch asks nothing of slurmctld while it schedules.

Two profiles, so that corral is compared with Slurm as a site would run it for many short jobs, not only
with a Slurm left as it comes:

  untuned  what this comparison ran before: FIFO scheduling (sched/builtin) with `defer`, no accounting,
           everything else Slurm's defaults (logging at info; when a batch job is submitted or ends, its
           scheduling may wait up to batch_sched_delay, 3 s; a pass considers default_queue_depth, 100,
           jobs).
  tuned    Slurm's High Throughput Computing Administration Guide
           (https://slurm.schedmd.com/high_throughput.html), applied to one node and one submitter:
           - SchedulerParameters: `defer` (schedule many jobs in one pass, not each at submission), with
             the two delays the guide describes set to none: batch_sched_delay=0 and sched_min_interval=0.
             The guide's sample values (20 s, 2 s) throttle a scheduler beset by many submitters, which
             saves its CPU for them; here one client submits and the figure is how soon jobs start, so the
             scheduler may run whenever a job ends. default_queue_depth=TUNED_QUEUE_DEPTH: a pass may
             consider more jobs than the node has CPUs, so one pass fills every free CPU.
           - SlurmctldDebug and SlurmdDebug at `error` ("more detailed logging will decrease system
             throughput").
           - MessageTimeout=30 (the guide: slurmctld's responsiveness is load dependent, the 10 s default
             "might need to be increased"; two loaded cores are such a load).
           - PriorityType=priority/basic (FIFO, the guide's fastest), munged with 10 threads (the guide's
             suggestion; its default is 2).
           Both profiles already do the rest of the guide's advice: no accounting storage or gathering,
           MinJobAge of a few seconds, MaxJobCount large, sched/builtin, no slurmctld prolog or epilog,
           no job-submit plugin, logs on local storage. What is not followed, and why: jobcomp/none
           (the completion log is how a batch is timed; it costs an appended line per job); max_rpc_cnt
           (not in the guide; the man page says it defers scheduling while slurmctld serves many RPCs,
           trading job starts for responsiveness, and one client sends one RPC at a time); several
           SlurmctldPorts, and the kernel's and munged's limits (for bursts of many clients at once, and
           machine-wide settings this shared machine keeps).

`SlurmCluster.start` checks that Slurm took each profile's settings: slurmctld parses the file (and
stops at a name it does not know), `scontrol show config` must show every value asked, and every
SchedulerParameters option must be one the installed Slurm's slurm.conf(5) documents, because
slurmctld looks those up by name and ignores the rest: a misspelt one would silently leave Slurm's
default in place.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

START_TIMEOUT_S = 30.0
JOB_TIMEOUT_S = 900.0
POLL_S = 0.02
PROFILES = ("untuned", "tuned")
TUNED_QUEUE_DEPTH = 1000
TUNED_MUNGE_THREADS = 10


def profile_settings(profile: str) -> dict[str, str]:
    """The slurm.conf settings that make PROFILE (see the module's docstring), as `scontrol show config`
    shows them once Slurm has taken them."""
    if profile == "untuned":
        return {"SchedulerType": "sched/builtin", "SchedulerParameters": "defer"}
    if profile == "tuned":
        return {"SchedulerType": "sched/builtin",
                "SchedulerParameters": f"defer,batch_sched_delay=0,sched_min_interval=0,"
                                       f"default_queue_depth={TUNED_QUEUE_DEPTH}",
                "PriorityType": "priority/basic",
                "SlurmctldDebug": "error",
                "SlurmdDebug": "error",
                "MessageTimeout": "30"}
    raise ValueError(f"no Slurm profile {profile!r}: one of {', '.join(PROFILES)}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _config(root: Path, socket_dir: Path, cpus: int, profile: str) -> str:
    return "\n".join([
        "ClusterName=corralbench",
        "SlurmctldHost=localhost(127.0.0.1)",
        f"SlurmctldPort={_free_port()}",
        f"SlurmdPort={_free_port()}",
        "SlurmUser=root",
        "AuthType=auth/munge",
        f"AuthInfo=socket={socket_dir / 'munge.sock'}",
        "CredType=cred/munge",
        "CommunicationParameters=NoCtldInAddrAny,NoInAddrAny",
        f"StateSaveLocation={root / 'state'}",
        f"SlurmdSpoolDir={root / 'spool'}",
        f"SlurmctldPidFile={root / 'state' / 'slurmctld.pid'}",
        f"SlurmdPidFile={root / 'spool' / 'slurmd.pid'}",
        f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={root / 'log' / 'slurmd.log'}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SwitchType=switch/none",
        "MpiDefault=none",
        *(f"{name}={value}" for name, value in profile_settings(profile).items()),
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/filetxt",
        f"JobCompLoc={root / 'log' / 'jobcomp.txt'}",
        "MaxArraySize=1000001",
        "MaxJobCount=1000000",
        "MinJobAge=2",
        "ReturnToService=2",
        # The node declares more CPUs than this machine has (as a worker declares its cores).
        "SlurmdParameters=config_overrides",
        f"NodeName=localhost NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=1000 State=UNKNOWN",
        "PartitionName=bench Nodes=localhost Default=YES MaxTime=INFINITE State=UP",
        "",
    ])


def documented_scheduler_options() -> set[str]:
    """The SchedulerParameters options the installed Slurm's slurm.conf(5) lists (`batch_sched_delay`,
    `defer`, ...)."""
    page = subprocess.run(["man", "-w", "slurm.conf"], capture_output=True, text=True)
    if page.returncode != 0:
        raise RuntimeError(f"slurm.conf(5) is not installed, so the profiles' scheduler options cannot be checked: "
                           f"{page.stderr.strip()}")
    text = gzip.decompress(Path(page.stdout.strip()).read_bytes()).decode()
    section = text.split("\n\\fBSchedulerParameters\\fR\n", 1)[1].split("\n\\fBSchedulerTimeSlice\\fR\n", 1)[0]
    return set(re.findall(r"^\\fB([a-z_]+)", section, re.MULTILINE))


def undocumented_scheduler_options(settings: dict[str, str]) -> set[str]:
    """The SchedulerParameters options in SETTINGS that the installed Slurm does not document."""
    asked = {option.split("=")[0] for option in settings["SchedulerParameters"].split(",")}
    return asked - documented_scheduler_options()


def shows(shown: dict[str, str], name: str, value: str) -> bool:
    """Whether `scontrol show config` shows NAME as VALUE (it adds units: `MessageTimeout = 30 sec`)."""
    return shown.get(name, "").split(" ")[0] == value


@dataclasses.dataclass
class SlurmCluster:
    """A running private Slurm (`start` makes one)."""

    root: Path
    """Its configuration, keys, state, spool and logs."""
    profile: str
    """One of PROFILES."""
    env: dict[str, str]
    """The environment its commands run in (SLURM_CONF names its configuration)."""
    processes: dict[str, subprocess.Popen[bytes]]
    """munged, slurmctld and slurmd, by name."""

    @staticmethod
    def version() -> str:
        return subprocess.run(["slurmctld", "-V"], capture_output=True, text=True, check=True).stdout.split()[-1]

    @classmethod
    @contextlib.contextmanager
    def start(cls, root: Path, cpus: int, profile: str = "untuned") -> Iterator[SlurmCluster]:
        """Munged, slurmctld and slurmd under ROOT, configured as PROFILE, until the node is idle and
        `scontrol show config` shows every setting of the profile; all stopped on the way out."""
        if shutil.which("slurmctld") is None or shutil.which("munged") is None:
            raise RuntimeError("Slurm is not installed: scripts/setup.sh --for test installs slurm-wlm and munge")
        settings = profile_settings(profile)
        if undocumented := undocumented_scheduler_options(settings):
            raise RuntimeError(f"Slurm {cls.version()} has no SchedulerParameters option {sorted(undocumented)}")
        for part in ("munge", "state", "spool", "log"):
            (root / part).mkdir(mode=0o700, parents=True, exist_ok=True)
        # munged wants its socket's directory, and every one above it, searchable by everyone: a directory
        # of its own in /tmp (whatever $TMPDIR's parents are).
        socket_dir = Path(tempfile.mkdtemp(prefix="corral-munge-", dir="/tmp"))
        socket_dir.chmod(0o755)
        key = root / "munge" / "munge.key"
        subprocess.run(["mungekey", "--create", "--keyfile", str(key)], check=True, capture_output=True)
        (root / "slurm.conf").write_text(_config(root, socket_dir, cpus, profile))
        env = {**os.environ, "SLURM_CONF": str(root / "slurm.conf")}
        cluster = cls(root, profile, env, {})
        threads = [f"--num-threads={TUNED_MUNGE_THREADS}"] if profile == "tuned" else []
        try:
            cluster._spawn("munged", ["munged", "--foreground", *threads, f"--socket={socket_dir / 'munge.sock'}",
                                      f"--key-file={key}", f"--pid-file={root / 'munge' / 'munged.pid'}",
                                      f"--log-file={root / 'log' / 'munged.log'}",
                                      f"--seed-file={root / 'munge' / 'munged.seed'}"])
            cluster._until(lambda: (socket_dir / "munge.sock").exists(), "munged's socket")
            cluster._spawn("slurmctld", ["slurmctld", "-D", "-i"])
            cluster._spawn("slurmd", ["slurmd", "-D", "-N", "localhost"])
            cluster._until(cluster._idle, "the node to be idle")
            shown = cluster.shown_config()
            if not_taken := {name: shown.get(name) for name, value in settings.items()
                             if not shows(shown, name, value)}:
                raise RuntimeError(f"Slurm did not take the {profile} profile's settings {settings}: "
                                   f"it shows {not_taken}")
            yield cluster
        finally:
            cluster._stop()
            shutil.rmtree(socket_dir, ignore_errors=True)

    def shown_config(self) -> dict[str, str]:
        """slurmctld's running configuration, as `scontrol show config` prints it (name -> value)."""
        result = subprocess.run(["scontrol", "show", "config"], env=self.env, capture_output=True, text=True,
                                check=True)
        return {name.strip(): value.strip() for name, sep, value in
                (line.partition(" = ") for line in result.stdout.splitlines()) if sep}

    def _spawn(self, name: str, argv: list[str]) -> None:
        with open(self.root / "log" / f"{name}.out", "ab") as out:
            self.processes[name] = subprocess.Popen(argv, env=self.env, cwd=self.root, stdout=out,
                                                    stderr=subprocess.STDOUT, start_new_session=True)

    def _until(self, ready: object, what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready():  # type: ignore[operator]
            if gone := [n for n, p in self.processes.items() if p.poll() is not None]:
                raise RuntimeError(f"Slurm's {gone} exited; logs in {self.root / 'log'}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"waited {START_TIMEOUT_S} s for {what}; logs in {self.root / 'log'}")
            time.sleep(0.1)

    def _idle(self) -> bool:
        result = subprocess.run(["sinfo", "-h", "-o", "%T"], env=self.env, capture_output=True, text=True)
        return result.returncode == 0 and result.stdout.strip() == "idle"

    def _stop(self) -> None:
        for name in ("slurmd", "slurmctld", "munged"):
            process = self.processes.get(name)
            if process is None:
                continue
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def _sbatch(self, *options: str) -> str:
        result = subprocess.run(["sbatch", "--parsable", "--output=/dev/null", *options, "--wrap=true"],
                                env=self.env, cwd=self.root, capture_output=True, text=True, check=True)
        return result.stdout.strip().split(";")[0]

    def _wait(self, ids: set[str], n: int) -> None:
        """Until `n` jobs whose JobId or ArrayJobId is in `ids` are in the completion log (any that ended
        otherwise than COMPLETED is an error). Reads only what was appended since the last look."""
        log, done, offset, partial = self.root / "log" / "jobcomp.txt", 0, 0, b""
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while done < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"Slurm finished {done} of {n} jobs in {JOB_TIMEOUT_S} s")
            time.sleep(POLL_S)
            with contextlib.suppress(FileNotFoundError), open(log, "rb") as f:
                f.seek(offset)
                chunk = f.read()
                offset += len(chunk)
                *lines, partial = (partial + chunk).split(b"\n")
                for line in lines:
                    fields = dict(part.split("=", 1) for part in line.decode().split() if "=" in part)
                    if fields.get("JobId") in ids or fields.get("ArrayJobId") in ids:
                        if fields.get("JobState") != "COMPLETED":
                            raise RuntimeError(f"a Slurm job ended {fields.get('JobState')}: {line.decode()}")
                        done += 1

    def array_s(self, n_jobs: int) -> float:
        """Seconds from submitting an array of `n_jobs` tasks of `true` to the last one's completion."""
        started = time.perf_counter()
        self._wait({self._sbatch(f"--array=1-{n_jobs}")}, n_jobs)
        return time.perf_counter() - started

    def chain_s(self, n_links: int) -> float:
        """Seconds from submitting a chain of `n_links` jobs (each afterok the one before) to its end."""
        started = time.perf_counter()
        ids = [self._sbatch()]
        for _ in range(n_links - 1):
            ids.append(self._sbatch(f"--dependency=afterok:{ids[-1]}", "--kill-on-invalid-dep=yes"))
        self._wait(set(ids), n_links)
        return time.perf_counter() - started
