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
