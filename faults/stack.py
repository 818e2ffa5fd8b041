"""A `corral up` to break: started as a child process on a data directory of
its own, with what a fault needs to find its parts (by the pids corral up
and its drivers started) and to read the database afterwards."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pymysql
import pymysql.cursors

import corral
from services.db.database import DatabaseConfig
from services.up import process as up_process
from services.up.process import UpProcess

T = TypeVar("T")

UP_ARGS = ("--worker-cores", "4", "--max-workers", "2", "--heartbeat-timeout", "20")
"""How every fault runs `corral up`: two workers of 4 cores at most, a worker declared dead after 20 s
without a heartbeat (twice the leader's lease and the workers' patience with a silent driver, so that
a failover costs no worker)."""

LOST_REASONS = ("worker_lost", "instance deactivated")
"""How an attempt ends when its worker is declared dead (its report, or the driver's deactivation)."""

FINAL_STATES = ("Success", "Failed", "Error", "Cancelled")


def progress(message: str) -> None:
    """A line on stderr, for the person watching."""
    print(message, file=sys.stderr, flush=True)


def eventually(check: Callable[[], T], timeout_s: float, interval_s: float = 0.2, what: str = "condition") -> T:
    """Poll `check` until it returns something truthy; raise TimeoutError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(interval_s)


def _argv(pid: int) -> list[str]:
    with contextlib.suppress(OSError):
        return [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    return []


def _processes() -> dict[int, list[str]]:
    """pid -> argv of every process (from /proc)."""
    return {int(e.name): argv for e in Path("/proc").iterdir() if e.name.isdigit() and (argv := _argv(int(e.name)))}


def alive(pid: int) -> bool:
    """Whether `pid` is a process that has not exited (zombies count as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


@dataclasses.dataclass
class Stack:
    """A running `corral up` and the ways in."""

    up: UpProcess

    @property
    def data_dir(self) -> Path:
        return self.up.data_dir

    def client(self) -> corral.Client:
        """A blocking client as the administrator."""
        return corral.Client(self.up.endpoints["frontend"], self.up.admin_token, ca_cert=self.up.endpoints["ca_cert"],
                             auth_address=self.up.endpoints["auth"])

    def submit(self, name: str, n_jobs: int, argv: Sequence[str]) -> int:
        """Submit a batch named `name` of `n_jobs` jobs of a quarter core each running `argv`; its id."""
        with self.client() as client:
            return client.submit(batch(name, n_jobs, argv)).batch_id

    def api_answers(self) -> bool:
        """Whether the frontend answers a call that reads the database (a list of batches' first page)."""
        try:
            with self.client() as client:
                next(iter(client.list_batches(page_size=1)), None)
            return True
        except corral.CorralError:
            return False

    def database(self) -> DatabaseConfig:
        """The administrator's connection to corral's database."""
        config = DatabaseConfig.from_url(self.up.endpoints["database"])
        password_file = self.data_dir / "mariadb" / "admin.password"
        if not config.password and password_file.exists():
            config = dataclasses.replace(config, password=password_file.read_text().strip())
        return config

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        """Rows of one statement on corral's database, as the administrator."""
        kwargs = self.database().connect_kwargs()
        kwargs["database"] = kwargs.pop("db", None)
        conn = pymysql.connect(**kwargs, cursorclass=pymysql.cursors.DictCursor)
        try:
            with conn.cursor() as cursor:
                cursor.execute(sql, tuple(params))
                return list(cursor.fetchall())
        finally:
            conn.close()

    def _ours(self, module: str) -> list[tuple[int, list[str]]]:
        """(pid, argv) of the live processes of `python -m MODULE` that name this stack's data directory."""
        data = str(self.data_dir)
        return sorted((pid, argv) for pid, argv in _processes().items()
                      if module in argv and any(data in arg for arg in argv) and alive(pid))

    def driver_pids(self) -> dict[str, int]:
        """Internal address ('localhost:PORT') -> pid of every live driver."""
        found = {}
        for pid, argv in self._ours("services.driver"):
            port = argv[argv.index("--internal-address") + 1].rpartition(":")[2]
            found[f"localhost:{port}"] = pid
        return found

    def service_name(self, pid: int) -> str:
        """The name `corral up` gave the service process `pid` (its log is logs/NAME.log): the stem of its
        --ports-file."""
        argv = _argv(pid)
        return Path(argv[argv.index("--ports-file") + 1]).stem

    def leader(self) -> tuple[int, str, int] | None:
        """(epoch, address, pid) of the driver the database says leads, if it is alive."""
        rows = self.query("SELECT epoch, leader_name FROM leader_epoch")
        if not rows or not rows[0]["leader_name"]:
            return None
        pid = self.driver_pids().get(rows[0]["leader_name"])
        return None if pid is None else (int(rows[0]["epoch"]), rows[0]["leader_name"], pid)

    def frontend_pid(self) -> int | None:
        pids = [pid for pid, _ in self._ours("services.frontend")]
        return pids[0] if pids else None

    def worker_pids(self) -> dict[str, int]:
        """Instance name -> pid of every live local worker."""
        return {argv[argv.index("--instance-name") + 1]: pid for pid, argv in self._ours("services.worker")}

    def mariadb_pid(self) -> int | None:
        pid_file = self.data_dir / "mariadb" / "mysqld.pid"
        with contextlib.suppress(OSError, ValueError):
            pid = int(pid_file.read_text().split()[0])
            return pid if alive(pid) else None
        return None

    def batch_state(self, batch_id: int) -> str:
        return self.query("SELECT state FROM batches WHERE batch_id = %s", (batch_id,))[0]["state"]

    def lost_attempts(self, batch_id: int, instance: str | None = None) -> int:
        """Attempts of the batch (on `instance`, if given) ended because their worker was declared dead."""
        sql = "SELECT COUNT(*) n FROM attempts WHERE batch_id = %s AND reason IN (%s, %s)"
        params: list[Any] = [batch_id, *LOST_REASONS]
        if instance is not None:
            sql += " AND instance_name = %s"
            params.append(instance)
        return int(self.query(sql, params)[0]["n"])

    def lost_detail(self, batch_id: int) -> str:
        """Where the batch's lost attempts were lost, and why each instance was deactivated (for a report)."""
        rows = self.query(
            "SELECT a.instance_name, i.deactivation_reason, COUNT(*) n, "
            "SUM(a.start_time_ms IS NULL) never_started FROM attempts a "
            "LEFT JOIN instances i ON i.name = a.instance_name WHERE a.batch_id = %s AND a.reason IN (%s, %s) "
            "GROUP BY a.instance_name, i.deactivation_reason", [batch_id, *LOST_REASONS])
        return "; ".join(f"{r['n']} on {r['instance_name']} ({r['never_started']} never started), deactivated: "
                         f"{r['deactivation_reason']}" for r in rows)

    def wait_complete(self, batch_ids: Sequence[int], timeout_s: float) -> float:
        """Wait until every batch is complete (read from the database, so that it works whatever is down);
        return the seconds waited. Raises TimeoutError."""
        started = time.monotonic()
        marks = ",".join(["%s"] * len(batch_ids))

        def done() -> bool:
            with contextlib.suppress(pymysql.MySQLError):
                rows = self.query(f"SELECT COUNT(*) n FROM batches WHERE batch_id IN ({marks}) AND state = 'complete'",
                                  batch_ids)
                return rows[0]["n"] == len(batch_ids)
            return False

        eventually(done, timeout_s, 0.5, f"batches {list(batch_ids)} to complete")
        return time.monotonic() - started

    def log_marks(self) -> dict[Path, int]:
        """Where each service log ends now (see `logs_since`)."""
        return {path: path.stat().st_size for path in (self.data_dir / "logs").glob("*.log")}

    def logs_since(self, marks: dict[Path, int], pattern: str = "*.log") -> str:
        """What the logs matching `pattern` got since `marks`."""
        text = []
        for path in sorted((self.data_dir / "logs").glob(pattern)):
            with open(path, "rb") as f:
                f.seek(marks.get(path, 0))
                text.append(f.read().decode(errors="replace"))
        return "".join(text)

    def stop(self) -> None:
        self.up.stop()


def batch(name: str, n_jobs: int, argv: Sequence[str]) -> corral.BatchBuilder:
    """A batch named `name` of `n_jobs` jobs of a quarter core each running `argv`."""
    builder = corral.BatchBuilder("default", attributes={"name": name})
    for _ in range(n_jobs):
        builder.job("busybox", list(argv), cores=0.25)
    return builder


def kill(pid: int, sig: int = signal.SIGKILL) -> None:
    """Send `sig` to `pid` if it is still there."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


@contextlib.contextmanager
def running(*up_args: str, work_dir: Path | None = None) -> Iterator[Stack]:
    """`corral up UP_ARGS` on a fresh data directory; stopped (by its pid) afterwards."""
    with contextlib.ExitStack() as cleanup:
        if work_dir is None:
            work_dir = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="corral-fault-")))
        work_dir.mkdir(parents=True, exist_ok=True)
        progress(f"starting corral up in {work_dir}")
        stack = Stack(up_process.start(work_dir, *up_args))
        try:
            yield stack
        finally:
            progress("stopping corral up")
            with contextlib.suppress(subprocess.TimeoutExpired):
                stack.up.stop()  # the one running now: a fault may have started another (restore does)
