"""A private MariaDB server: its own data directory and socket, no TCP port.

Tests, benchmarks and the embedded `corral up` start one instead of touching
a system server. `PrivateMariaDB(root)` keeps its data under `root` (kept
across restarts); without a root it uses a temporary directory and removes
it on stop. The process is stopped by its pid.

It is private in fact, not only by name: `root` (which holds the socket) is
0700, so no other local account can reach the socket, and the
administrator's account has a random password kept 0600 in
`root/admin.password`; the services log in with accounts of their own
(`services.db.accounts`). It never adopts a server it did not start: if
something already serves `root` (a server left behind by a killed `corral
up`), `start` refuses and names its pid.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import pymysql

from services.common.files import write_atomically
from services.db.database import DatabaseConfig


class ServerAlreadyRunning(RuntimeError):
    """Another mariadbd serves this data directory."""

_SBIN = ("/usr/sbin", "/usr/local/sbin", "/usr/bin")


def find_program(program: str) -> str:
    found = shutil.which(program) or next(
        (str(Path(d) / program) for d in _SBIN if (Path(d) / program).exists()), None
    )
    if found is None:
        raise RuntimeError(f"{program} not found: run scripts/setup.sh --for run (it installs mariadb-server)")
    return found


def administrator(root: Path, database: str) -> DatabaseConfig:
    """The administrator's login to the private server whose root is `root` (`corral up`'s DATA/mariadb), on
    `database`. Raises FileNotFoundError if no server was ever started there."""
    password = (root / "admin.password").read_text().strip()
    return DatabaseConfig(unix_socket=str(root / "mysqld.sock"), user="root", password=password, database=database)


def server_pid(config: DatabaseConfig) -> int | None:
    """The pid of the MariaDB process serving `config` (from its pid file), or None when it cannot be read
    (a server on another host, or of another user)."""
    conn = pymysql.connect(**config.connect_kwargs(with_database=False))
    try:
        with conn.cursor() as cursor:
            cursor.execute("SELECT @@pid_file")
            (pid_file,) = cursor.fetchone()
    finally:
        conn.close()
    try:
        return int(Path(pid_file).read_text().strip())
    except (OSError, ValueError):
        return None


def server_rss_bytes(config: DatabaseConfig) -> int | None:
    """The resident memory of the MariaDB process serving `config`, from /proc, or None
    when it cannot be read (a server on another host, or of another user)."""
    pid = server_pid(config)
    if pid is None:
        return None
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    kib = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), None)
    return None if kib is None else kib * 1024


class PrivateMariaDB:
    """One mariadbd process serving a throwaway data directory."""

    def __init__(self, root: Path | None = None, fast_unsafe: bool = True, launcher: Sequence[str] = ()) -> None:
        self._temporary = root is None
        self.root = Path(tempfile.mkdtemp(prefix="corral-mariadb-")) if root is None else root
        self.socket = str(self.root / "mysqld.sock")
        self.fast_unsafe = fast_unsafe
        """Trade crash durability for speed (tests, benchmarks)."""
        self.launcher = tuple(launcher)
        """An argv prefix that runs mariadbd, e.g. `corral up`'s, which makes it die with `corral up`
        (services.common.parent_death). With one, the server also gets a session of its own: a Ctrl-C
        at the terminal reaches only the supervisor, which stops the server last, in order."""
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def _password_file(self) -> Path:
        return self.root / "admin.password"

    def _foreign_server_pid(self) -> int | None:
        """A server already serving `root`: the live mariadbd its pid file names, -1 for an unknown
        process answering on the socket, None if there is none."""
        try:
            pid = int((self.root / "mysqld.pid").read_text().strip())
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"mariadbd" in command or b"mysqld" in command:
                return pid
        except (OSError, ValueError):
            pass
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.connect(self.socket)
        except OSError:
            return None
        return -1

    def start(self, timeout_s: float = 60.0) -> DatabaseConfig:
        """Initialise the data directory if new, start mariadbd, wait until it answers; the
        administrator's settings. Refuses (ServerAlreadyRunning) if another server serves `root`."""
        datadir = self.root / "data"
        user_args = ["--user=root"] if os.geteuid() == 0 else []
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o700)  # the socket lives here: no other account may reach it
        foreign = self._foreign_server_pid()
        if foreign is not None:
            what = f"pid {foreign}" if foreign > 0 else f"something on {self.socket}"
            raise ServerAlreadyRunning(f"a MariaDB server ({what}) already serves {self.root}; corral uses only a "
                                       "server it starts itself: stop that one, or pass --database-url to use it")
        # Its temporary files beside its data, not in the host's /tmp: private like the rest, and apart from
        # any other server's (two install-db bootstraps at once in /tmp once clashed on a temporary table).
        (self.root / "tmp").mkdir(mode=0o700, exist_ok=True)
        if not (datadir / "mysql").is_dir():
            installed = subprocess.run(
                [find_program("mariadb-install-db"), "--no-defaults", f"--datadir={datadir}",
                 "--auth-root-authentication-method=normal", "--skip-test-db", f"--tmpdir={self.root / 'tmp'}",
                 *user_args],
                capture_output=True, text=True, errors="replace",
            )
            if installed.returncode != 0:  # its own words, which say why (a full disk, a port, a bad datadir)
                words = (installed.stderr.strip() or installed.stdout.strip()).splitlines()[-8:]
                raise RuntimeError(f"mariadb-install-db failed (exit {installed.returncode}) in {datadir}: "
                                   + " | ".join(words))
        durability = (["--innodb-flush-log-at-trx-commit=2", "--sync-binlog=0"] if self.fast_unsafe else [])
        self.process = subprocess.Popen(
            [*self.launcher, find_program("mariadbd"), "--no-defaults", f"--datadir={datadir}",
             f"--socket={self.socket}",
             f"--pid-file={self.root / 'mysqld.pid'}", "--skip-networking", f"--log-error={self.root / 'error.log'}",
             "--innodb-buffer-pool-size=512M", "--innodb-log-file-size=256M", *durability, "--skip-log-bin",
             f"--tmpdir={self.root / 'tmp'}", "--max-connections=500", "--innodb-lock-wait-timeout=20", *user_args],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=bool(self.launcher),
        )
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"mariadbd exited: {self.error_log()}")
            try:
                # Probe with a plain socket first: pymysql leaks the socket of
                # a connection attempt that fails.
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                    probe.connect(self.socket)
                return self._admin_config()
            except (OSError, pymysql.err.OperationalError):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"mariadbd did not come up: {self.error_log()}") from None
                time.sleep(0.05)

    def _admin_config(self) -> DatabaseConfig:
        """Log in as the administrator; on a new (or older, password-less) data directory, give the
        administrator a random password first, kept 0600 beside the data."""
        config = DatabaseConfig(unix_socket=self.socket, user="root", password="", database="mysql")
        if self._password_file.exists():
            password = self._password_file.read_text().strip()
            pymysql.connect(**{**config.connect_kwargs(with_database=False), "password": password}).close()
            return DatabaseConfig(unix_socket=self.socket, user="root", password=password, database="mysql")
        password = secrets.token_urlsafe(24)
        connection = pymysql.connect(unix_socket=self.socket, user="root")
        try:
            with connection.cursor() as cursor:
                write_atomically(self._password_file, password.encode(), 0o600)
                cursor.execute("ALTER USER 'root'@'localhost' IDENTIFIED BY %s", (password,))
                # install-db also makes root@<hostname> and passwordless accounts for the OS user; nobody needs them.
                cursor.execute("SELECT User, Host FROM mysql.user WHERE NOT (User = 'root' AND Host = 'localhost') "
                               "AND User NOT LIKE 'corral%%' AND User <> 'mariadb.sys'")
                for user, host in cursor.fetchall():
                    cursor.execute("DROP USER %s@%s", (user, host))
        finally:
            connection.close()
        return DatabaseConfig(unix_socket=self.socket, user="root", password=password, database="mysql")

    def alive(self) -> bool:
        """Whether the server this object started is still running."""
        return self.process is not None and self.process.poll() is None

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
