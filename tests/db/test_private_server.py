"""The private MariaDB is private in fact: its socket is out of other accounts' reach, its
administrator has a password, and it never adopts a server it did not start."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pymysql
import pytest

from services.db.server import PrivateMariaDB, ServerAlreadyRunning


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateMariaDB]:
    mariadb = PrivateMariaDB(tmp_path_factory.mktemp("private") / "mariadb", fast_unsafe=True)
    mariadb.start()
    try:
        yield mariadb
    finally:
        mariadb.stop()


def test_the_directory_and_password_are_private(server: PrivateMariaDB) -> None:
    assert server.root.stat().st_mode & 0o777 == 0o700
    password_file = server.root / "admin.password"
    assert password_file.stat().st_mode & 0o777 == 0o600
    with pytest.raises(pymysql.err.OperationalError) as error:
        pymysql.connect(unix_socket=server.socket, user="root", password="")
    assert error.value.args[0] == 1045  # ER_ACCESS_DENIED_ERROR
    pymysql.connect(unix_socket=server.socket, user="root", password=password_file.read_text().strip()).close()
    connection = pymysql.connect(unix_socket=server.socket, user="root", password=password_file.read_text().strip())
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT CONCAT(User, '@', Host) FROM mysql.user WHERE User <> 'mariadb.sys'")
            assert {row[0] for row in cursor.fetchall()} == {"root@localhost"}  # no anonymous or OS accounts
    finally:
        connection.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another account")
def test_another_account_cannot_reach_the_socket(server: PrivateMariaDB) -> None:
    probe = ("import socket, sys\n"
             "s = socket.socket(socket.AF_UNIX)\n"
             "try:\n    s.connect(sys.argv[1])\nexcept PermissionError:\n    sys.exit(3)\n")
    result = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
                             probe, server.socket], capture_output=True, text=True, timeout=30)
    assert result.returncode == 3, result.stderr


def test_a_second_start_refuses_the_running_server(server: PrivateMariaDB) -> None:
    with pytest.raises(ServerAlreadyRunning) as error:
        PrivateMariaDB(server.root, fast_unsafe=True).start()
    assert server.process is not None and str(server.process.pid) in str(error.value)
    assert server.alive()


def test_a_restart_after_a_crash_keeps_the_password(tmp_path: Path) -> None:
    mariadb = PrivateMariaDB(tmp_path / "mariadb", fast_unsafe=True)
    first = mariadb.start()
    try:
        assert mariadb.process is not None
        mariadb.process.kill()
        mariadb.process.wait()
        assert not mariadb.alive()
        again = mariadb.start()
        assert again.password == first.password
        pymysql.connect(unix_socket=again.unix_socket, user="root", password=again.password).close()
    finally:
        mariadb.stop()
