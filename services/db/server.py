"""A private MariaDB server: its own data directory and socket, no TCP port.

Tests, benchmarks and the embedded `corral up` start one instead of touching
a system server. `PrivateMariaDB(root)` keeps its data under `root` (kept
across restarts); without a root it uses a temporary directory and removes
it on stop. The process is stopped by its pid.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pymysql

from services.db.database import DatabaseConfig

_SBIN = ("/usr/sbin", "/usr/local/sbin", "/usr/bin")


def _find(program: str) -> str:
    found = shutil.which(program) or next(
        (str(Path(d) / program) for d in _SBIN if (Path(d) / program).exists()), None
    )
    if found is None:
        raise RuntimeError(f"{program} not found: run scripts/setup.sh (it installs mariadb-server)")
    return found


def server_rss_bytes(config: DatabaseConfig) -> int | None:
    """The resident memory of the MariaDB process serving `config`, from /proc, or None
    when it cannot be read (a server on another host, or of another user)."""
    conn = pymysql.connect(**config.connect_kwargs(with_database=False))
    try:
        with conn.cursor() as cursor:
            cursor.execute("SELECT @@pid_file")
            (pid_file,) = cursor.fetchone()
    finally:
        conn.close()
    try:
        pid = int(Path(pid_file).read_text().strip())
        status = Path(f"/proc/{pid}/status").read_text()
    except (OSError, ValueError):
        return None
    kib = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), None)
    return None if kib is None else kib * 1024


class PrivateMariaDB:
    """One mariadbd process serving a throwaway data directory."""

    def __init__(self, root: Path | None = None, fast_unsafe: bool = True) -> None:
        self._temporary = root is None
        self.root = Path(tempfile.mkdtemp(prefix="corral-mariadb-")) if root is None else root
        self.socket = str(self.root / "mysqld.sock")
        self.fast_unsafe = fast_unsafe
        """Trade crash durability for speed (tests, benchmarks)."""
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 60.0) -> DatabaseConfig:
        """Initialise the data directory if new, start mariadbd, wait until it answers."""
        datadir = self.root / "data"
        user_args = ["--user=root"] if os.geteuid() == 0 else []
        if not (datadir / "mysql").is_dir():
            self.root.mkdir(parents=True, exist_ok=True)
            subprocess.run(
                [_find("mariadb-install-db"), "--no-defaults", f"--datadir={datadir}",
                 "--auth-root-authentication-method=normal", "--skip-test-db", *user_args],
                check=True, capture_output=True,
            )
        durability = (["--innodb-flush-log-at-trx-commit=2", "--sync-binlog=0"] if self.fast_unsafe else [])
        self.process = subprocess.Popen(
            [_find("mariadbd"), "--no-defaults", f"--datadir={datadir}", f"--socket={self.socket}",
             f"--pid-file={self.root / 'mysqld.pid'}", "--skip-networking", f"--log-error={self.root / 'error.log'}",
             "--innodb-buffer-pool-size=512M", "--innodb-log-file-size=256M", *durability, "--skip-log-bin",
             "--max-connections=500", "--innodb-lock-wait-timeout=20", *user_args],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        config = DatabaseConfig(unix_socket=self.socket, user="root", password="", database="mysql")
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"mariadbd exited: {self.error_log()}")
            try:
                # Probe with a plain socket first: pymysql leaks the socket of
                # a connection attempt that fails.
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                    probe.connect(self.socket)
                pymysql.connect(unix_socket=self.socket, user="root").close()
                return config
            except (OSError, pymysql.err.OperationalError):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"mariadbd did not come up: {self.error_log()}") from None
                time.sleep(0.05)

    def error_log(self) -> str:
        path = self.root / "error.log"
        return path.read_text()[-2000:] if path.exists() else "(no error log)"

    def stop(self) -> None:
        """SIGTERM the server by its pid and wait; remove a temporary root."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._temporary:
            shutil.rmtree(self.root, ignore_errors=True)
