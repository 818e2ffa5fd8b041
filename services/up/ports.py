"""Free ports for the services `corral up` starts, below the kernel's ephemeral range (each service keeps
the one it was given across its restarts: services.up.app)."""

from __future__ import annotations

import random
import socket
from pathlib import Path


def _ephemeral_ports() -> range:
    """The kernel's range for port-0 binds and outgoing connections."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return range(int(low), int(high) + 1)
    except (OSError, ValueError):
        return range(32768, 61000)


def free_port() -> int:
    """A port free now, below the kernel's ephemeral range.

    The service binds it a moment later. A port the kernel handed out (port 0)
    could by then be the source port of any outgoing connection on the
    machine, and a driver died on exactly that; ports below the ephemeral
    range are only ever taken by a listener that asks for one by number. If
    one does, the service reports it and `corral up` stops with its log named;
    a service keeps its port when it is restarted, and if something took it
    meanwhile, the restarts fail and `corral up` gives up (services.up.supervisor).
    """
    ephemeral = _ephemeral_ports()
    candidates = [port for port in range(10000, 32768) if port not in ephemeral]
    for port in random.sample(candidates, min(200, len(candidates))):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
