"""A private single-node Slurm on loopback, for comparing corral with it (bench/slurm_compare.py).

Debian's slurm-wlm and munge (scripts/setup.sh --for test installs them; the system services are not used): a
munged with its own key and socket, a slurmctld and a slurmd in the foreground, on ports other than
Slurm's defaults and bound to 127.0.0.1 only, with every file under one directory. Each daemon is
stopped by its pid on the way out.

Completion is read from Slurm's own job-completion log (jobcomp/filetxt: a line per finished job), so
timing a batch asks nothing of slurmctld while it schedules.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _config(root: Path, socket_dir: Path, cpus: int) -> str:
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
        "SchedulerType=sched/builtin",
        "SchedulerParameters=defer",
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


@dataclasses.dataclass
class SlurmCluster:
    root: Path
    env: dict[str, str]
    processes: dict[str, subprocess.Popen[bytes]]

    @staticmethod
    def version() -> str:
        return subprocess.run(["slurmctld", "-V"], capture_output=True, text=True, check=True).stdout.split()[-1]

    @classmethod
    @contextlib.contextmanager
    def start(cls, root: Path, cpus: int) -> Iterator[SlurmCluster]:
        if shutil.which("slurmctld") is None or shutil.which("munged") is None:
            raise RuntimeError("Slurm is not installed: scripts/setup.sh --for test installs slurm-wlm and munge")
        for part in ("munge", "state", "spool", "log"):
            (root / part).mkdir(mode=0o700, parents=True, exist_ok=True)
        # munged wants its socket's directory, and every one above it, searchable by everyone: a directory
        # of its own in /tmp (whatever $TMPDIR's parents are).
        socket_dir = Path(tempfile.mkdtemp(prefix="corral-munge-", dir="/tmp"))
        socket_dir.chmod(0o755)
        key = root / "munge" / "munge.key"
        subprocess.run(["mungekey", "--create", "--keyfile", str(key)], check=True, capture_output=True)
        (root / "slurm.conf").write_text(_config(root, socket_dir, cpus))
        env = {**os.environ, "SLURM_CONF": str(root / "slurm.conf")}
        cluster = cls(root, env, {})
        try:
            cluster._spawn("munged", ["munged", "--foreground", f"--socket={socket_dir / 'munge.sock'}",
                                      f"--key-file={key}", f"--pid-file={root / 'munge' / 'munged.pid'}",
                                      f"--log-file={root / 'log' / 'munged.log'}",
                                      f"--seed-file={root / 'munge' / 'munged.seed'}"])
            cluster._until(lambda: (socket_dir / "munge.sock").exists(), "munged's socket")
            cluster._spawn("slurmctld", ["slurmctld", "-D", "-i"])
            cluster._spawn("slurmd", ["slurmd", "-D", "-N", "localhost"])
            cluster._until(cluster._idle, "the node to be idle")
            yield cluster
        finally:
            cluster._stop()
            shutil.rmtree(socket_dir, ignore_errors=True)

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
