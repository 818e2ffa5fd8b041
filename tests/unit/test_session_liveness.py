"""A worker session counts as live for the dead-worker detector only while its worker is heard from:
a session cut off by a partition stays open on the driver until the transport notices."""

from __future__ import annotations

import time
from typing import cast

from services.driver.sessions import SessionRegistry
from services.driver.store import DriverStore
from services.common.specs import SpecStore


def test_a_silent_session_is_not_heard_from() -> None:
    registry = SessionRegistry(cast(DriverStore, None), cast(SpecStore, None))
    talking, silent = registry.open("w1"), registry.open("w2")
    silent.heard_at = time.monotonic() - 25.0
    assert registry.connected_instances() == {"w1", "w2"}
    assert registry.heard_from(20.0) == {"w1"}
    talking.heard_at = time.monotonic() - 30.0
    assert registry.heard_from(20.0) == set()
    assert registry.heard_from(60.0) == {"w1", "w2"}
