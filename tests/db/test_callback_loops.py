"""Completion callbacks on a real MariaDB, POSTed to a real HTTP server on
127.0.0.1: once per completion, retried with back-off, given up in the end."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.common.callback_hosts import checked_addresses
from services.common.urls import CallbackRules, IPAddress
from services.db.database import InvalidArgumentError, NotFoundError, StaleEpochError
from services.db.invariants import check_invariants
from services.driver.callbacks import (CompletionCallbacks, HttpCallbackSender, RetryPolicy, next_attempt_ms,
                                       rfc3339_ms)
from tests.http_receiver import Receiver, receiving
from tests.world import World


# The receiver listens on loopback, which callbacks may reach only when an
# operator allows it: every sender here says so explicitly.
LOOPBACK = CallbackRules.parse(["127.0.0.0/8"])


def sender(**kwargs: Any) -> HttpCallbackSender:
    return HttpCallbackSender(rules=LOOPBACK, **kwargs)


def callbacks(world: World, epoch: Callable[[], int | None] | None = None, **kwargs: Any) -> CompletionCallbacks:
    """The loop as a driver runs it, on the world's clock, sending with `sender()` unless told otherwise."""
    kwargs.setdefault("sender", sender())
    return CompletionCallbacks(world.store, epoch or (lambda: world.epoch), clock_ms=world.clock, **kwargs)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with receiving() as r:
        yield r


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
    first = callbacks(world)
    await asyncio.gather(first.cycle(), first.cycle())
    second = callbacks(world)
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
        await callbacks(world, lambda: old_epoch).cycle()
    await callbacks(world).cycle()
    assert len(receiver.requests) == 1

    # A leader that claimed a callback and died before sending it: the next
    # one waits for the lease to run out, then sends it once.
    later = await completed_batch(world, receiver.url("/later"), ("Cancelled",))
    assert len(await world.store.claim_batch_callbacks(world.epoch, 10, lease_ms=60_000)) == 1
    world.epoch = await world.store.elect_leader("driver-2")
    third = callbacks(world)
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
    loop = callbacks(world)
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
    loop = callbacks(world, policy=policy)
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
    await callbacks(world).cycle()
    assert len(receiver.requests) == 4
    assert await check_invariants(world.db) == []


async def test_a_slow_url_holds_up_nothing_else(world: World, receiver: Receiver) -> None:
    await world.instance()
    slow = await completed_batch(world, receiver.url("/slow"))
    fast = await completed_batch(world, receiver.url())
    loop = callbacks(world, sender=sender(timeout_s=0.5))
    started = asyncio.get_running_loop().time()
    await loop.cycle()
    assert asyncio.get_running_loop().time() - started < 5
    assert (await outbox(world, fast))["callback_state"] == "sent"
    row = await outbox(world, slow)
    assert (row["callback_state"], row["callback_error"]) == ("pending", "no answer within 0.5 s")


class Rebinding:
    """A resolver whose answers for a name change from one lookup to the next, as an attacker's DNS
    server's can: each lookup gets the next list of `answers` (the last one from then on)."""

    def __init__(self, *answers: list[str]):
        self.answers = [[ipaddress.ip_address(a) for a in answer] for answer in answers]
        self.lookups: list[tuple[str, int]] = []

    async def __call__(self, host: str, port: int) -> list[IPAddress]:
        self.lookups.append((host, port))
        return self.answers[min(len(self.lookups), len(self.answers)) - 1]


async def test_callbacks_into_the_deployment_are_given_up_at_once_without_the_operators_setting(
        world: World, receiver: Receiver) -> None:
    await world.instance()
    batches = {url: await completed_batch(world, url)
               for url in (receiver.url(), "http://169.254.169.254/latest/meta-data/", "http://10.1.2.3/done",
                           "http://2130706433/done")}
    loop = callbacks(world, sender=HttpCallbackSender(timeout_s=0.5))  # the default rules: public addresses only
    await loop.cycle()
    errors = {}
    for url, batch_id in batches.items():
        row = await outbox(world, batch_id)
        assert (row["callback_state"], row["callback_attempts"]) == ("given_up", 1)
        errors[url] = row["callback_error"]
    assert errors == {
        receiver.url(): "callback_url refused: 127.0.0.1 is a loopback address",
        "http://169.254.169.254/latest/meta-data/":
            "callback_url refused: 169.254.169.254 is the cloud metadata service's link-local address",
        "http://10.1.2.3/done": "callback_url refused: 10.1.2.3 is a private address",
        "http://2130706433/done":
            "callback_url refused: numeric host '2130706433' is not written as four decimal numbers (a.b.c.d)"}
    assert receiver.requests == []
    assert loop.given_up_total == 4


async def test_a_name_that_rebinds_to_loopback_after_submission_is_refused_at_send_time(
        world: World, receiver: Receiver) -> None:
    """The frontend resolved the name to a public address; when the driver sends, the same name
    resolves to loopback: the driver checks again, and sends nothing."""
    await world.instance()
    url = receiver.url(host="hooks.example")
    resolve = Rebinding(["93.184.215.14"], ["93.184.215.14", "127.0.0.1"])
    await checked_addresses(url, CallbackRules(), resolve)  # what the frontend did at submission
    batch_id = await completed_batch(world, url)
    loop = callbacks(world, sender=HttpCallbackSender(timeout_s=0.5, resolve=resolve))
    await loop.cycle()
    row = await outbox(world, batch_id)
    assert (row["callback_state"], row["callback_attempts"], row["callback_error"]) == (
        "given_up", 1, "callback_url refused: hooks.example resolves to 127.0.0.1, a loopback address")
    assert resolve.lookups == [("hooks.example", receiver.port)] * 2
    assert receiver.requests == []


async def test_a_callback_connects_to_the_address_it_checked_and_names_its_host(world: World,
                                                                                receiver: Receiver) -> None:
    """hooks.example resolves (only through the injected resolver) to the loopback receiver, which
    the operator allows: the POST arrives there with the name in its Host header."""
    await world.instance()
    url = receiver.url(host="hooks.example")
    batch_id = await completed_batch(world, url)
    resolve = Rebinding(["127.0.0.1"])
    await callbacks(world, sender=sender(resolve=resolve)).cycle()
    [post] = receiver.posts()
    assert post["headers"]["Host"] == f"hooks.example:{receiver.port}"
    assert (await outbox(world, batch_id))["callback_state"] == "sent"


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
