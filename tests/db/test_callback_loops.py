"""Completion callbacks on a real MariaDB, POSTed to a real HTTP server on
127.0.0.1: once per completion, retried with back-off, given up in the end."""

from __future__ import annotations

import asyncio
import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.db.database import InvalidArgumentError, NotFoundError, StaleEpochError
from services.db.invariants import check_invariants
from services.driver.callbacks import (CompletionCallbacks, HttpCallbackSender, RetryPolicy, next_attempt_ms,
                                       rfc3339_ms)
from tests.world import World


class Receiver:
    """An HTTP server on 127.0.0.1 port 0 that records every request and
    answers with the next status of `statuses` (200 when none is left);
    requests to /slow get no answer until the test ends."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.statuses: list[int] = []
        self.release = threading.Event()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the name http.server calls
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.requests.append({"path": self.path, "headers": dict(self.headers),
                                          "body": json.loads(body)})
                if self.path == "/slow":
                    receiver.release.wait(10)
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def url(self, path: str = "/done") -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def posts(self, path: str = "/done") -> list[dict[str, Any]]:
        return [r for r in self.requests if r["path"] == path]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    r.thread.start()
    try:
        yield r
    finally:
        r.release.set()
        r.server.shutdown()
        r.server.server_close()
        r.thread.join()


async def completed_batch(world: World, url: str | None, states: tuple[str, ...] = ("Success",),
                          **kwargs: Any) -> int:
    batch_id, _, s = await world.batch([{}] * len(states), callback_url=url, **kwargs)
    for i, state in enumerate(states):
        attempt = await world.run(batch_id, s + i)
        await world.finish(batch_id, s + i, attempt, state)
    assert (await world.batch_row(batch_id))["state"] == "complete"
    return batch_id


async def outbox(world: World, batch_id: int) -> dict[str, Any]:
    row = await world.db.fetchone("SELECT * FROM batch_completions WHERE batch_id = %s", (batch_id,))
    assert row is not None
    return row


async def test_one_post_per_completion_when_run_twice_and_after_a_failover(world: World,
                                                                           receiver: Receiver) -> None:
    await world.instance()
    batch_id = await completed_batch(world, receiver.url(), ("Success", "Failed"), attributes={"name": "dag"})
    silent = await completed_batch(world, None)
    first = CompletionCallbacks(world.db, world.store, lambda: world.epoch, clock_ms=world.clock)
    await asyncio.gather(first.cycle(), first.cycle())
    second = CompletionCallbacks(world.db, world.store, lambda: world.epoch, clock_ms=world.clock)
    await second.cycle()

    [post] = receiver.posts()
    body = post["body"]
    row = await outbox(world, batch_id)
    assert body == {
        "batch_id": batch_id, "user": "alice", "billing_project": "proj", "state": "failure",
        "counts": {"n_jobs": 2, "n_completed": 2, "n_succeeded": 1, "n_failed": 1, "n_errored": 0,
                   "n_cancelled": 0},
        "cost_usd": 0.0, "completed_at": rfc3339_ms(row["time_completed_ms"]),
        "completed_at_ms": row["time_completed_ms"], "attributes": {"name": "dag"}}
    assert post["headers"]["Content-Type"] == "application/json"
    assert post["headers"]["Corral-Callback-Id"] == f"{batch_id}-2"
    assert (row["callback_state"], row["callback_sent_ms"], row["callback_attempts"]) == ("sent", world.clock(), 1)
    assert (await outbox(world, silent))["callback_state"] == "none"

    # A new leader: the old one is fenced off, the new one finds nothing to send.
    old_epoch = world.epoch
    world.epoch = await world.store.elect_leader("driver-1")
    with pytest.raises(StaleEpochError):
        await CompletionCallbacks(world.db, world.store, lambda: old_epoch, clock_ms=world.clock).cycle()
    await CompletionCallbacks(world.db, world.store, lambda: world.epoch, clock_ms=world.clock).cycle()
    assert len(receiver.requests) == 1

    # A leader that claimed a callback and died before sending it: the next
    # one waits for the lease to run out, then sends it once.
    later = await completed_batch(world, receiver.url("/later"), ("Cancelled",))
    assert len(await world.store.claim_batch_callbacks(world.epoch, 10, lease_ms=60_000)) == 1
    world.epoch = await world.store.elect_leader("driver-2")
    third = CompletionCallbacks(world.db, world.store, lambda: world.epoch, clock_ms=world.clock)
    await third.cycle()
    assert receiver.posts("/later") == []
    world.clock.advance(60_000)
    await third.cycle()
    await third.cycle()
    [late] = receiver.posts("/later")
    assert (late["body"]["batch_id"], late["body"]["state"]) == (later, "success")
    assert (await outbox(world, later))["callback_state"] == "sent"
    assert await check_invariants(world.db) == []


async def test_a_failed_callback_is_retried_after_its_back_off(world: World, receiver: Receiver) -> None:
    await world.instance()
    batch_id = await completed_batch(world, receiver.url())
    receiver.statuses = [500]
    loop = CompletionCallbacks(world.db, world.store, lambda: world.epoch, clock_ms=world.clock)
    await loop.cycle()
    row = await outbox(world, batch_id)
    assert (row["callback_state"], row["callback_attempts"], row["callback_error"]) == ("pending", 1, "HTTP 500")
    assert row["callback_next_attempt_ms"] == world.clock() + 1000
    await loop.cycle()  # not due yet
    assert len(receiver.posts()) == 1
    world.clock.advance(1000)
    await loop.cycle()
    assert len(receiver.posts()) == 2
    row = await outbox(world, batch_id)
    assert (row["callback_state"], row["callback_attempts"], row["callback_sent_ms"]) == ("sent", 2, world.clock())
    assert (loop.sent_total, loop.failed_total, loop.given_up_total) == (1, 1, 0)
    assert receiver.posts()[0]["body"] == receiver.posts()[1]["body"]


async def test_a_callback_that_keeps_failing_is_given_up(world: World, receiver: Receiver) -> None:
    await world.instance()
    batch_id = await completed_batch(world, receiver.url())
    bad_url = await completed_batch(world, "ftp://127.0.0.1/done")
    receiver.statuses = [500] * 100
    policy = RetryPolicy(first_delay_s=1, max_delay_s=4, give_up_after_s=10)
    loop = CompletionCallbacks(world.db, world.store, lambda: world.epoch, policy=policy, clock_ms=world.clock)
    # Attempts at 0, 1, 3 and 7 s after the completion; the next would be
    # at 11 s, past the 10 s allowed.
    for _ in range(20):
        await loop.cycle()
        world.clock.advance(500)
    assert len(receiver.posts()) == 4
    row = await outbox(world, batch_id)
    assert (row["callback_state"], row["callback_attempts"], row["callback_error"]) == ("given_up", 4, "HTTP 500")
    assert row["callback_given_up_ms"] is not None and row["callback_sent_ms"] is None
    row = await outbox(world, bad_url)
    assert (row["callback_state"], row["callback_error"]) == ("given_up", "callback_url is not an http or https URL")
    assert loop.given_up_total == 2
    # Given up is final, after a restart too.
    await CompletionCallbacks(world.db, world.store, lambda: world.epoch, clock_ms=world.clock).cycle()
    assert len(receiver.requests) == 4
    assert await check_invariants(world.db) == []


async def test_a_slow_url_holds_up_nothing_else(world: World, receiver: Receiver) -> None:
    await world.instance()
    slow = await completed_batch(world, receiver.url("/slow"))
    fast = await completed_batch(world, receiver.url())
    loop = CompletionCallbacks(world.db, world.store, lambda: world.epoch,
                               sender=HttpCallbackSender(timeout_s=0.5), clock_ms=world.clock)
    started = asyncio.get_running_loop().time()
    await loop.cycle()
    assert asyncio.get_running_loop().time() - started < 5
    assert (await outbox(world, fast))["callback_state"] == "sent"
    row = await outbox(world, slow)
    assert (row["callback_state"], row["callback_error"]) == ("pending", "no answer within 0.5 s")


async def test_refused_calls_write_nothing(world: World, receiver: Receiver) -> None:
    await world.instance()
    batch_id = await completed_batch(world, receiver.url())
    before = await outbox(world, batch_id)
    with pytest.raises(InvalidArgumentError):
        await world.store.claim_batch_callbacks(world.epoch, 0, lease_ms=1000)
    with pytest.raises(StaleEpochError):
        await world.store.claim_batch_callbacks(world.epoch - 1, 10, lease_ms=1000)
    with pytest.raises(InvalidArgumentError):
        await world.store.record_batch_callback(world.epoch, batch_id, 1, "maybe")
    with pytest.raises(InvalidArgumentError):
        await world.store.record_batch_callback(world.epoch, batch_id, 1, "retry", error="HTTP 500")
    with pytest.raises(NotFoundError):
        await world.store.record_batch_callback(world.epoch, batch_id, 2, "sent")
    with pytest.raises(StaleEpochError):
        await world.store.record_batch_callback(world.epoch - 1, batch_id, 1, "sent")
    assert await outbox(world, batch_id) == before
    # A settled row keeps what it has.
    await world.store.record_batch_callback(world.epoch, batch_id, 1, "sent")
    again = await world.store.record_batch_callback(world.epoch, batch_id, 1, "given_up", error="late")
    assert (again["message"], again["callback_state"]) == ("already settled", "sent")
    assert (await outbox(world, batch_id))["callback_error"] is None
    assert receiver.requests == []


@given(failures=st.integers(1, 200), now_ms=st.integers(0, 10**13), age_ms=st.integers(0, 10**9),
       first_s=st.floats(0.001, 60), max_s=st.floats(0.001, 3600), give_up_s=st.floats(0, 10**6))
def test_the_back_off_is_capped_grows_and_stops_in_time(failures: int, now_ms: int, age_ms: int, first_s: float,
                                                        max_s: float, give_up_s: float) -> None:
    policy = RetryPolicy(first_delay_s=first_s, max_delay_s=max_s, give_up_after_s=give_up_s)
    completed_ms = now_ms - age_ms
    at = next_attempt_ms(policy, failures, now_ms, completed_ms)
    if at is not None:
        assert now_ms <= at <= now_ms + int(max_s * 1000)
        assert at <= completed_ms + int(give_up_s * 1000)
        earlier = next_attempt_ms(policy, max(1, failures - 1), now_ms, completed_ms)
        assert earlier is not None and earlier <= at
    else:
        delay_ms = min(int(max_s * 1000), int(first_s * 1000 * 2 ** min(failures - 1, 40)))
        assert now_ms + delay_ms > completed_ms + int(give_up_s * 1000)
