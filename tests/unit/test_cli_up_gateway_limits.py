"""`corral up`'s --gateway-* flags: each sets its field of the gateways' Limits, the rest keep their defaults, and
a value the gateway would not take is refused at once, naming the flag's setting."""

from __future__ import annotations

import argparse

import pytest

from corral.errors import UsageError
from services.up.cli import GATEWAY_LIMITS, add_commands, gateway_limits_of
from services.gateway.deployment import Limits
from services.gateway.envoy_process import fd_hard_limit
from services.gateway.hardening import FD_RESERVE


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers())
    return parser.parse_args(["up", *argv])


def test_each_flag_sets_its_limit_and_the_rest_keep_their_defaults() -> None:
    assert gateway_limits_of(parse()) == Limits()
    limits = gateway_limits_of(parse("--gateway-max-connections", "500", "--gateway-request-headers-timeout", "3",
                                     "--gateway-idle-timeout", "4", "--gateway-stream-idle-timeout", "600",
                                     "--gateway-request-timeout", "30", "--gateway-tls-handshake-timeout", "5"))
    assert (limits.max_connections, limits.request_headers_timeout_s, limits.idle_timeout_s,
            limits.stream_idle_timeout_s, limits.request_timeout_s, limits.tls_handshake_timeout_s) == (
        500, 3, 4, 600, 30, 5)
    assert set(GATEWAY_LIMITS) <= {field for field in Limits.__dataclass_fields__}


def test_a_timeout_of_zero_is_refused_naming_it() -> None:
    with pytest.raises(UsageError, match="idle_timeout_s"):
        gateway_limits_of(parse("--gateway-idle-timeout", "0"))


def test_a_cap_envoy_could_not_hold_is_refused_with_what_would_fit() -> None:
    room = fd_hard_limit() - FD_RESERVE
    assert gateway_limits_of(parse("--gateway-max-connections", str(room))).max_connections == room
    with pytest.raises(UsageError, match=f"at most {room}"):
        gateway_limits_of(parse("--gateway-max-connections", str(room + 1)))
