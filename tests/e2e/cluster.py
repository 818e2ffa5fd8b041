"""`corral up` as a process, for end-to-end tests: start it, read what it
printed, reach it through the CLI, the Python client and its database, and
stop it (and so everything it started) by its pid."""

from __future__ import annotations

import contextlib
import dataclasses
import ssl
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pymysql
import pymysql.cursors

import corral
import faults.stack
from services.db.database import DatabaseConfig
from services.up import process as up_process
from services.up.process import UpProcess

REPO_DIR = up_process.REPO_DIR
T = TypeVar("T")


def processes() -> dict[int, list[str]]:
    """pid -> argv of every process (from /proc: ps truncates to $COLUMNS, which pytest sets)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                found[int(entry.name)] = [a.decode(errors="replace") for a in argv if a]
    return found


def eventually(check: Callable[[], T], timeout_s: float = 60.0, interval_s: float = 0.2,
               what: str = "condition") -> T:
    """Poll `check` until it returns something truthy; fail the test after `timeout_s`."""
    try:
        return faults.stack.eventually(check, timeout_s, interval_s, what)
    except TimeoutError as e:
        raise AssertionError(str(e)) from None


class Cluster(UpProcess):
    """A running `corral up`, with what tests reach it through."""

    @property
    def frontend(self) -> str:
        return self.endpoints["frontend"]

    def client(self, token: str | None = None) -> corral.Client:
        """A blocking client as `token`'s user (default: the administrator)."""
        return corral.Client(self.frontend, token or self.admin_token, ca_cert=self.endpoints["ca_cert"],
                             auth_address=self.endpoints["auth"])

    def cli(self, *args: str, env: dict[str, str] | None = None, input: str | None = None,
            timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        """Run `corral ARGS` against this cluster."""
        return subprocess.run([sys.executable, "-m", "corral.cli", *args], env={**self.env, **(env or {})},
                              capture_output=True, text=True, input=input, timeout=timeout_s)

    def user(self, name: str) -> str:
        """A new user in the 'default' billing project; returns an API token for them."""
        with self.client() as admin:
            admin.create_user(name)
            admin.add_member("default", name)
            _, secret = admin.create_token("e2e", username=name)
        return secret

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        """Rows of one read-only statement on corral's database."""
        conn = self._connect(cursorclass=pymysql.cursors.DictCursor)
        try:
            with conn.cursor() as cursor:
                cursor.execute(sql, tuple(params))
                return list(cursor.fetchall())
        finally:
            conn.close()

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement that changes corral's database (as an operator would), committed; rows changed."""
        conn = self._connect(autocommit=True)
        try:
            with conn.cursor() as cursor:
                return cursor.execute(sql, tuple(params))
        finally:
            conn.close()

    def _connect(self, **options: Any) -> pymysql.Connection:
        config = DatabaseConfig.from_url(self.endpoints["database"])
        password_file = self.data_dir / "mariadb" / "admin.password"  # the private server's administrator
        if not config.password and password_file.exists():
            config = dataclasses.replace(config, password=password_file.read_text().strip())
        kwargs = config.connect_kwargs()
        kwargs["database"] = kwargs.pop("db", config.database)  # aiomysql's name for it
        return pymysql.connect(**{**kwargs, **options})

    def scrape(self, target: str, path: str = "/metrics", with_certificate: bool = True) -> str:
        """GET https://TARGET/PATH as Prometheus would with `corral up --metrics`: verifying the server with
        DATA/ca.pem and showing the scraper's certificate (DATA/certs/metrics), unless told not to."""
        context = ssl.create_default_context(cafile=str(self.data_dir / "ca.pem"))
        if with_certificate:
            certs = self.data_dir / "certs" / "metrics"
            context.load_cert_chain(certs / "metrics.pem", certs / "metrics.key")
        with urllib.request.urlopen(f"https://{target}{path}", timeout=10, context=context) as answer:
            return answer.read().decode()

    def worker_pids(self) -> dict[str, int]:
        """Instance name -> pid of every local worker process of this cluster alive now."""
        found = {}
        for pid, argv in processes().items():
            if "services.worker" in argv and "--instance-name" in argv and any(
                    str(self.data_dir) in arg for arg in argv):
                found[argv[argv.index("--instance-name") + 1]] = pid
        return found

    def descendants(self) -> set[int]:
        """Every process `corral up` started, directly or not."""
        children: dict[int, list[int]] = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError, ValueError, IndexError):
                    # /proc/PID/stat: "pid (comm) state ppid ..."; comm may hold spaces.
                    ppid = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
                    children.setdefault(ppid, []).append(int(entry.name))
        found, todo = set(), [self.process.pid]
        while todo:
            for child in children.get(todo.pop(), []):
                if child not in found:
                    found.add(child)
                    todo.append(child)
        return found

def start(work_dir: Path, *up_args: str, command: Sequence[str] | None = None,
          timeout_s: float = 180) -> Cluster:
    """`services.up.process.start`, as a Cluster."""
    up = up_process.start(work_dir, *up_args, command=command, timeout_s=timeout_s)
    return Cluster(**{f.name: getattr(up, f.name) for f in dataclasses.fields(up)})


def running(cluster: Cluster) -> Iterator[Cluster]:
    """Yield the cluster and stop it afterwards (for fixtures)."""
    try:
        yield cluster
    finally:
        cluster.stop()
