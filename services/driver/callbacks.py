"""Completion callbacks (design §4): one POST per batch completion.

`check_completions` writes exactly one `batch_completions` row each time a
batch completes: the outbox. Each cycle this loop leases the due rows
(`claim_batch_callbacks`: pending, not before their next attempt, up to
`per_cycle`), builds each body from the database, POSTs them all at once
through a `CallbackSender`, and records what each came to
(`record_batch_callback`):

- a 2xx marks the row sent (`callback_sent_ms`); it is never sent again, by
  this driver, a restarted one or a new leader;
- anything else (a non-2xx status, a timeout, a refused connection) is
  retried with capped exponential back-off (`RetryPolicy`) until
  `give_up_after_s` after the completion; then the row is given up and keeps
  the last error in `callback_error`;
- a URL no retry can make sendable (not http(s), or its host is or resolves
  to an address callbacks may not reach: see services/common/urls.py) is
  given up at once, the reason in `callback_error`.

The URL was checked when the batch was created; it is checked again when
sent, because what a name resolves to can change in between (DNS
rebinding): `HttpCallbackSender` resolves the host, checks every address and
connects to a checked one (`PinnedTransport`). Redirects are not followed.

The lease makes a row invisible to every other claimer while one driver
sends it, so running the loop twice or failing over sends one POST. The one
window left is a driver that dies after the POST and before recording it:
the next leader sends again after the lease, so receivers get the
`Corral-Callback-Id` header to recognise a repeat. Each POST is bounded by
`timeout_s` in total, and the loop runs in its own task: a slow URL holds
up neither the other callbacks of the cycle nor any other loop.

The body (JSON, documented in docs/driver.md "Completion callbacks"):
batch_id, user, billing_project, state (success, failure or cancelled),
counts, cost_usd, completed_at (RFC 3339, UTC), completed_at_ms, attributes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import json
import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol
from urllib.parse import urlparse

import httpx

from services.common.callback_hosts import PinnedTransport, Resolve, SystemResolver, Unresolved
from services.common.urls import CallbackRules, RefusedUrl, parse_callback_url
from services.db.store import wall_clock_ms
from services.driver.loop import Loop
from services.driver.store import DriverStore

log = logging.getLogger(__name__)

USER_AGENT = "corral-driver"


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """When a failed callback is tried again, and when not any more."""

    first_delay_s: float = 1.0
    """Wait after the first failure; it doubles with each failure after that."""
    max_delay_s: float = 300.0
    """The back-off never waits longer than this between two attempts."""
    give_up_after_s: float = 24 * 3600.0
    """No attempt is made later than this after the batch completed."""


def next_attempt_ms(policy: RetryPolicy, failed_attempts: int, now_ms: int, completed_ms: int) -> int | None:
    """When to try again after `failed_attempts` (>= 1) failures, or None to give up.

    The delay is first_delay × 2^(failures − 1), capped at max_delay; a retry
    that would fall after completed_ms + give_up_after is not made."""
    if failed_attempts < 1:
        raise ValueError(f"failed_attempts must be at least 1, got {failed_attempts}")
    # The exponent is bounded so a long outage cannot build a huge integer.
    delay_ms = min(int(policy.max_delay_s * 1000), int(policy.first_delay_s * 1000 * 2 ** min(failed_attempts - 1, 40)))
    at_ms = now_ms + delay_ms
    return at_ms if at_ms <= completed_ms + int(policy.give_up_after_s * 1000) else None


@dataclasses.dataclass(frozen=True)
class Callback:
    """One POST to make."""

    url: str
    """The batch's callback_url."""
    body: dict[str, Any]
    """The JSON body."""
    callback_id: str
    """Stable per completion (batch id and its number of jobs), sent as Corral-Callback-Id."""


class Refused(str):
    """A failure no retry can cure (the URL or an address of its host is refused): given up at once."""


class CallbackSender(Protocol):
    """The one network boundary of this loop."""

    async def send(self, callbacks: Sequence[Callback]) -> list[str | None]:
        """POST every callback concurrently; per callback, None after a 2xx, else why it failed
        (a `Refused` when retrying cannot help)."""


class HttpCallbackSender:
    """`CallbackSender` over httpx: each URL's host resolved and checked against `rules` at send
    time and the connection pinned to a checked address, no redirects followed, each POST bounded
    by `timeout_s` in total."""

    def __init__(self, timeout_s: float = 5.0, rules: CallbackRules = CallbackRules(),
                 resolve: Resolve | None = None):
        self.timeout_s = timeout_s
        self.rules = rules
        """Networks callbacks may reach beyond public addresses (operator setting)."""
        self._resolve = resolve if resolve is not None else SystemResolver(timeout_s=min(2.0, timeout_s))

    async def send(self, callbacks: Sequence[Callback]) -> list[str | None]:
        if not callbacks:
            return []
        async with httpx.AsyncClient(transport=PinnedTransport(self.rules, self._resolve), timeout=self.timeout_s,
                                     follow_redirects=False, trust_env=False,
                                     headers={"User-Agent": USER_AGENT}) as client:
            return list(await asyncio.gather(*(self._post(client, c) for c in callbacks)))

    async def _post(self, client: httpx.AsyncClient, callback: Callback) -> str | None:
        try:
            parse_callback_url(callback.url, self.rules)  # before httpx, which refuses some URLs its own way
            # httpx's timeout bounds each phase; a server that drips its
            # answer byte by byte is bounded here as a whole.
            async with asyncio.timeout(self.timeout_s):
                response = await client.post(callback.url, content=json.dumps(callback.body).encode(),
                                              headers={"Content-Type": "application/json",
                                                       "Corral-Callback-Id": callback.callback_id})
        except TimeoutError:
            return f"no answer within {self.timeout_s:g} s"
        except RefusedUrl as e:
            return Refused(f"callback_url refused: {e}")
        except Unresolved as e:  # DNS may answer later: retried like a refused connection
            return str(e)
        except Exception as e:  # noqa: BLE001 - whatever went wrong is recorded and retried
            return f"{type(e).__name__}: {e}"[:1024]
        if response.is_success:
            return None
        return f"HTTP {response.status_code}"


def _is_http_url(url: str) -> bool:
    parsed = urlparse(url)
    return parsed.scheme in ("http", "https") and bool(parsed.netloc)


def rfc3339_ms(ms: int) -> str:
    """UTC time of `ms` since the epoch, e.g. 2023-11-14T22:13:20.000Z."""
    moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def callback_body(row: dict[str, Any], claimed: dict[str, Any], attributes: dict[str, str]) -> dict[str, Any]:
    """The JSON body for one completion: `row` its batch's `DriverStore.callback_details`, `claimed` the
    outbox row."""
    failures = int(row["n_failed"]) + int(row["n_errored"])
    state = "cancelled" if row["cancelled"] else ("failure" if failures else "success")
    return {
        "batch_id": int(row["batch_id"]),
        "user": row["user"],
        "billing_project": row["billing_project"],
        "state": state,
        "counts": {"n_jobs": int(claimed["n_jobs"]),
                   **{k: int(row[k]) for k in ("n_completed", "n_succeeded", "n_failed", "n_errored",
                                                "n_cancelled")}},
        "cost_usd": float(row["cost_usd"]),
        "completed_at": rfc3339_ms(int(claimed["time_completed_ms"])),
        "completed_at_ms": int(claimed["time_completed_ms"]),
        "attributes": attributes,
    }


class CompletionCallbacks(Loop):
    """Sends each batch completion's callback once; see the module docstring."""

    name = "completion-callbacks"

    def __init__(self, store: DriverStore, epoch: Callable[[], int | None],
                 sender: CallbackSender | None = None, policy: RetryPolicy = RetryPolicy(),
                 period_s: float = 2.0, per_cycle: int = 50, lease_s: float = 60.0,
                 clock_ms: Callable[[], int] = wall_clock_ms):
        super().__init__(period_s)
        self._store = store
        self._epoch = epoch
        self._sender = sender if sender is not None else HttpCallbackSender()
        self.policy = policy
        self.per_cycle = per_cycle
        self._lease_ms = int(lease_s * 1000)
        self._clock_ms = clock_ms
        self.sent_total = 0
        """Callbacks answered with a 2xx since this loop started."""
        self.failed_total = 0
        """Failed attempts (to be retried or given up) since this loop started."""
        self.given_up_total = 0
        """Callbacks given up since this loop started."""

    async def _bodies(self, claimed: Sequence[dict[str, Any]]) -> dict[tuple[int, int], dict[str, Any]]:
        ids = sorted({int(c["batch_id"]) for c in claimed})
        rows = await self._store.callback_details(ids)
        attributes = await self._store.batch_attributes(ids)
        return {(int(c["batch_id"]), int(c["n_jobs"])): callback_body(rows[int(c["batch_id"])], c,
                                                                     attributes[int(c["batch_id"])])
                for c in claimed}

    async def cycle(self) -> None:
        epoch = self._epoch()
        if epoch is None:
            return
        claimed = await self._store.claim_batch_callbacks(epoch, self.per_cycle, self._lease_ms, self._clock_ms())
        if not claimed:
            return
        bodies = await self._bodies(claimed)
        sendable = []
        for c in claimed:
            if _is_http_url(c["callback_url"]):
                sendable.append(c)
            else:  # no retry can make it sendable
                await self._failed(epoch, c, "callback_url is not an http or https URL", retry=False)
        errors = await self._sender.send([
            Callback(c["callback_url"], bodies[(int(c["batch_id"]), int(c["n_jobs"]))],
                     f"{c['batch_id']}-{c['n_jobs']}")
            for c in sendable])
        for c, error in zip(sendable, errors, strict=True):
            if error is None:
                await self._store.record_batch_callback(epoch, c["batch_id"], c["n_jobs"], "sent",
                                                        now_ms=self._clock_ms())
                self.sent_total += 1
            else:
                await self._failed(epoch, c, error, retry=not isinstance(error, Refused))
        if len(claimed) == self.per_cycle:
            self.notify()  # more may be due

    async def _failed(self, epoch: int, claimed: dict[str, Any], error: str, retry: bool) -> None:
        now_ms = self._clock_ms()
        at_ms = next_attempt_ms(self.policy, int(claimed["callback_attempts"]) + 1, now_ms,
                                int(claimed["time_completed_ms"])) if retry else None
        self.failed_total += 1
        if at_ms is None:
            self.given_up_total += 1
            log.warning("%s: gave up the callback of batch %s after %d attempts: %s", self.name,
                        claimed["batch_id"], int(claimed["callback_attempts"]) + 1, error)
            await self._store.record_batch_callback(epoch, claimed["batch_id"], claimed["n_jobs"], "given_up",
                                                    error=error, now_ms=now_ms)
        else:
            log.info("%s: callback of batch %s failed (%s); next attempt in %d ms", self.name,
                     claimed["batch_id"], error, at_ms - now_ms)
            await self._store.record_batch_callback(epoch, claimed["batch_id"], claimed["n_jobs"], "retry",
                                                    error=error, next_attempt_ms=at_ms, now_ms=now_ms)
