"""`corral up`'s registry keeps its ports (services.registry.local.kept_ports): chosen once, the same at the
next start, moved only by --registry-port; a kept pull port another process holds stops the start, naming
the port and the flag, while a taken push port (only corral is told of it) is chosen anew."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from services.registry.local import RegistryPortTaken, kept_ports
from services.up.ports import free_port


def test_the_ports_are_chosen_once_and_kept(tmp_path: Path) -> None:
    pull, push = kept_ports(tmp_path, free_port)
    assert pull != push
    assert kept_ports(tmp_path, free_port) == (pull, push)
    assert json.loads((tmp_path / "ports.json").read_text()) == {"pull": pull, "push": push}
    assert (tmp_path / "ports.json").stat().st_mode & 0o777 == 0o600


def test_the_flag_moves_the_pull_port_and_it_stays_moved(tmp_path: Path) -> None:
    _, push = kept_ports(tmp_path, free_port)
    moved = free_port()
    assert kept_ports(tmp_path, free_port, moved) == (moved, push)
    assert kept_ports(tmp_path, free_port) == (moved, push)


def test_a_taken_pull_port_is_named_with_the_flag_and_a_taken_push_port_is_replaced(tmp_path: Path) -> None:
    pull, push = kept_ports(tmp_path, free_port)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", pull))
        squatter.listen()
        with pytest.raises(RegistryPortTaken) as taken:
            kept_ports(tmp_path, free_port)
    assert f"127.0.0.1:{pull}" in str(taken.value) and "--registry-port" in str(taken.value)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", push))
        squatter.listen()
        again, new_push = kept_ports(tmp_path, free_port)
    assert again == pull and new_push not in (pull, push)
