"""The CLI (corral.sizes) and the server (services.policy.sizes) say a size the same way: the client package
keeps its own copy because it imports nothing of the server's."""

from __future__ import annotations

from hypothesis import given, strategies as st

from corral.sizes import binary_size as client_size
from services.policy.sizes import binary_size as server_size


@given(st.integers(min_value=0, max_value=1 << 70))
def test_the_client_and_the_server_say_a_size_alike(n_bytes: int) -> None:
    assert client_size(n_bytes) == server_size(n_bytes)


def test_examples() -> None:
    assert [client_size(n) for n in (100, 1024, 16 << 30, 3 << 19)] == ["100 bytes", "1 KiB", "16 GiB", "1.5 MiB"]


def test_a_size_is_said_to_one_decimal() -> None:
    """A peak memory of 2,793,472 bytes read '2.66406 MiB' (issue 36): people read one decimal."""
    assert [client_size(n) for n in (2_793_472, 10 << 50, (1 << 30) - 1)] == ["2.7 MiB", "10 PiB", "1024 MiB"]
