"""The gateways' limits against slow, idle and greedy clients (services.gateway.hardening) as they land in both
generated configs, the connection cap's arithmetic against Envoy's file descriptor limit, and the refusals of
limits that would not limit. (tests/service/test_gateway_slow_clients.py attacks the real Envoy.)"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from services.gateway import write_configs
from services.gateway.__main__ import LOCAL
from services.gateway.configs import Config, internal_config, public_config
from services.gateway.deployment import Deployment, Limits
from services.gateway.envoy_process import check_fd_limit, fd_hard_limit, fd_limit_needed, fitting
from services.gateway.hardening import CONNECTIONS_MONITOR, FD_RESERVE, max_connections_within

LIMITS = Limits(max_connections=1234, request_headers_timeout_s=7, idle_timeout_s=8, stream_idle_timeout_s=90,
                request_timeout_s=30, tls_handshake_timeout_s=6, connection_buffer_bytes=16384,
                max_concurrent_streams=50, http2_stream_window_bytes=65536, http2_connection_window_bytes=2**20)


def deployment(limits: Limits = LIMITS) -> Deployment:
    return dataclasses.replace(Deployment.load(LOCAL), limits=limits)


def listeners(config: Config) -> dict[str, Config]:
    return {listener["name"]: listener for listener in config["static_resources"]["listeners"]}


def manager(listener: Config) -> Config:
    [chain] = listener["filter_chains"]
    return chain["filters"][-1]["typed_config"]


@pytest.mark.parametrize("build", [public_config, internal_config])
def test_every_listener_carries_the_limits(build) -> None:  # type: ignore[no-untyped-def]
    config = build(deployment())
    [monitor] = config["overload_manager"]["resource_monitors"]
    assert monitor["name"] == CONNECTIONS_MONITOR
    assert monitor["typed_config"]["max_active_downstream_connections"] == 1234
    # The admin socket answers (readiness, stats) while clients hold every connection.
    assert config["admin"]["ignore_global_conn_limit"] is True
    for name, listener in listeners(config).items():
        assert listener["per_connection_buffer_limit_bytes"] == 16384, name
        [chain] = listener["filter_chains"]
        assert chain["transport_socket_connect_timeout"] == "6s", name
        http = manager(listener)
        assert http["request_headers_timeout"] == "7s", name
        assert http["common_http_protocol_options"]["idle_timeout"] == "8s", name
        assert http["http2_protocol_options"]["max_concurrent_streams"] == 50, name
        assert http["http2_protocol_options"]["initial_stream_window_size"] == 65536, name
        assert http["http2_protocol_options"]["initial_connection_window_size"] == 2**20, name
        # The enrollment listener keeps its own, shorter, request timeouts.
        assert (http["stream_idle_timeout"], http["request_timeout"]) == (
            ("30s", "30s") if name == "enroll" else ("90s", "30s")), name
    for cluster in config["static_resources"]["clusters"]:
        if cluster["name"] != "admin":
            assert cluster["per_connection_buffer_limit_bytes"] == 16384, cluster["name"]


def test_public_headers_with_underscores_stay_refused_beside_the_idle_timeout() -> None:
    http = manager(listeners(public_config(deployment()))["public"])
    assert http["common_http_protocol_options"] == {"idle_timeout": "8s", "headers_with_underscores_action":
                                                    "REJECT_REQUEST"}


def test_a_grpc_call_over_the_size_limit_is_told_resource_exhausted_and_the_limit() -> None:
    mappers = manager(listeners(public_config(deployment()))["public"])["local_reply_config"]["mappers"]
    grpc_413 = [m for m in mappers if "headers_to_add" in m
                and m["filter"]["status_code_filter"]["comparison"]["value"]["default_value"] == 413]
    [mapper] = grpc_413
    assert mapper["headers_to_add"][0]["header"] == {"key": "grpc-status", "value": "8"}
    assert f"{LIMITS.max_request_bytes} bytes (max_request_bytes)" in mapper["body"]["inline_string"]


@pytest.mark.parametrize("field", ["stream_idle_timeout_s", "idle_timeout_s", "request_headers_timeout_s",
                                   "request_timeout_s", "tls_handshake_timeout_s"])
def test_a_timeout_of_zero_is_refused_since_envoy_reads_it_as_none(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        Limits(**{field: 0})


@pytest.mark.parametrize("field, value", [("max_connections", 0), ("max_concurrent_streams", 0),
                                          ("http2_stream_window_bytes", 1000), ("connection_buffer_bytes", 10)])
def test_a_limit_out_of_range_is_refused_by_name(field: str, value: int) -> None:
    with pytest.raises(ValueError, match=field):
        Limits(**{field: value})


@given(fd_limit=st.integers(1, 2_000_000), wanted=st.integers(1, 10_000_000))
def test_the_connection_cap_leaves_the_reserve_free(fd_limit: int, wanted: int) -> None:
    cap = max_connections_within(fd_limit, wanted)
    assert 1 <= cap <= wanted
    if fd_limit > FD_RESERVE:
        assert cap + FD_RESERVE <= fd_limit
        # And it takes all the room there is, up to what was wanted.
        assert cap == wanted or cap + FD_RESERVE == fd_limit


def test_envoy_is_given_the_cap_and_the_reserve_or_refused_by_name(tmp_path: Path) -> None:
    hard = fd_hard_limit()
    fits = dataclasses.replace(deployment(), limits=fitting(Limits()))
    assert fits.limits.max_connections == min(Limits().max_connections, hard - FD_RESERVE)
    [public, _] = write_configs(fits, tmp_path / "fits")
    assert check_fd_limit(public) == fd_limit_needed(public) == fits.limits.max_connections + FD_RESERVE <= hard
    too_many = dataclasses.replace(deployment(), limits=Limits(max_connections=hard))
    [public, _] = write_configs(too_many, tmp_path / "too-many")
    with pytest.raises(ValueError, match=f"max_connections to at most {hard - FD_RESERVE}"):
        check_fd_limit(public)
    stripped = yaml.safe_load(public.read_text())
    del stripped["overload_manager"]
    public.write_text(yaml.safe_dump(stripped))
    with pytest.raises(ValueError, match="no connection cap"):
        check_fd_limit(public)
