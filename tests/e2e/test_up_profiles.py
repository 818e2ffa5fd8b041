"""A restarted `corral up` logs nobody out: the user's profile stays current and follows the new ports,
and the `admin` profile it rewrites is the way back to the administrator."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e import cluster as up


def whoami(cluster: up.Cluster, *options: str) -> str:
    result = cluster.cli(*options, "whoami")
    assert result.returncode == 0, result.stderr
    return result.stdout.split()[0]


@pytest.mark.timeout(420)
def test_a_restart_keeps_the_users_login(tmp_path: Path) -> None:
    first = up.start(tmp_path)
    try:
        login = first.cli("login", "--token", first.user("alice"))
        assert login.returncode == 0, login.stderr
        assert whoami(first) == "alice"
    finally:
        assert first.stop() == 0
    second = up.start(tmp_path)  # the same data directory and CLI configuration, new ports
    try:
        assert second.frontend != first.frontend
        assert second.said("'alice' stays current"), second.output
        assert whoami(second) == "alice"
        assert whoami(second, "--profile", "admin") == "admin"
    finally:
        assert second.stop() == 0
