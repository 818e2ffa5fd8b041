"""The blocking client: `corral.Client`, a thin wrapper over `corral.aio.Client`.

Each call is written once, in the asyncio client; this one runs it on an
event loop in a thread of its own (`EventLoopThread`) and waits for the
answer, so both clients behave alike by construction: the same arguments,
results, typed errors, retries and resumption. Lists and streams become
blocking iterators, still fetched page by page (a list crosses between the
threads a page at a time) and closed when you stop iterating.

Any thread may call it, several at once, including one that runs an
asyncio loop of its own (the call then blocks that loop, as any blocking
call does). Ctrl-C during a call cancels the call. `close()` (or leaving
`with`) closes the channels and ends the thread; a client that is dropped
unclosed is closed when it is garbage-collected.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar, overload

from corral import aio
from corral.event_loop_thread import EventLoopThread
from corral.pages import Pages

P = ParamSpec("P")
T = TypeVar("T")


def _iterate(client: Client, result: AsyncIterator[T]) -> Iterator[T]:
    """`result`'s items, read on `client`'s loop: a list a page per hop between the threads. Holding
    `client` here keeps it open (not garbage-collected) while the iterator is in use."""
    if isinstance(result, Pages):
        pages = client._loop.iterate(result.pages)
        with contextlib.closing(pages):  # stopping early closes the list on the loop too
            for page in pages:
                yield from page
    else:
        yield from client._loop.iterate(result)


@overload
def _blocking(method: Callable[Concatenate[aio.Client, P], Coroutine[Any, Any, T]]
              ) -> Callable[Concatenate[Client, P], T]: ...


@overload
def _blocking(method: Callable[Concatenate[aio.Client, P], AsyncIterator[T]]
              ) -> Callable[Concatenate[Client, P], Iterator[T]]: ...


def _blocking(method: Callable[..., Any]) -> Callable[..., Any]:
    """`corral.aio.Client`'s `method` as a method of `Client`: a coroutine's result is waited for, an async
    iterator becomes a blocking one. Its name, docstring and signature stay, for help() and editors."""
    if inspect.iscoroutinefunction(method):
        def call(self: Client, *args: Any, **kwargs: Any) -> Any:
            return self._loop.run(method(self._client, *args, **kwargs))
    else:
        def call(self: Client, *args: Any, **kwargs: Any) -> Any:
            return _iterate(self, method(self._client, *args, **kwargs))
    functools.update_wrapper(call, method)
    call.__module__, call.__qualname__ = __name__, f"Client.{method.__name__}"
    signature = inspect.signature(method)
    returns = signature.return_annotation  # a string: the modules use `from __future__ import annotations`
    if isinstance(returns, str) and returns.startswith("AsyncIterator["):
        returns = returns.removeprefix("Async")
    call.__signature__ = signature.replace(return_annotation=returns)  # type: ignore[attr-defined]
    call.__annotations__ = {**method.__annotations__, "return": returns}
    return call


async def _made(factory: Callable[..., T], *args: Any) -> T:
    return factory(*args)


class Client:
    """Batches, jobs, logs, billing projects (and, with `auth_address`, users) over
    gRPC, authenticated with a bearer token; blocking calls. The same calls as
    `corral.aio.Client`, which documents each."""

    def __init__(self, address: str, token: str, ca_cert: str | Path | None = None,
                 auth_address: str | None = None):
        self._loop = EventLoopThread("corral.Client")
        try:  # on the loop: a grpc.aio channel belongs to the loop it is made on
            self._client = self._loop.run(_made(aio.Client, address, token, ca_cert, auth_address))
        except BaseException:
            self._loop.close()
            raise
        # Also what garbage collection calls: a client dropped unclosed leaves no thread behind.
        self._close = weakref.finalize(self, self._loop.close, self._client.close)

    @classmethod
    def from_profile(cls, profile: str | None = None) -> Client:
        """A client as the `corral` CLI would connect (see `corral.aio.Client.from_profile`)."""
        return cls(*aio.profile_connection(profile))

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the channels (cancelling calls still running) and end the client's thread; any call
        after that raises UsageError. A no-op once closed."""
        self._close()

    # Batches (corral/aio.py).
    submit = _blocking(aio.Client.submit)
    estimate = _blocking(aio.Client.estimate)
    update = _blocking(aio.Client.update)
    get_batch = _blocking(aio.Client.get_batch)
    list_batches = _blocking(aio.Client.list_batches)
    cancel_batch = _blocking(aio.Client.cancel_batch)
    regions = _blocking(aio.Client.regions)
    watch = _blocking(aio.Client.watch)
    wait = _blocking(aio.Client.wait)
    # Jobs, logs, groups, re-runs and locks (corral/calls.py).
    jobs = _blocking(aio.Client.jobs)
    get_job = _blocking(aio.Client.get_job)
    explain_job = _blocking(aio.Client.explain_job)
    job_log = _blocking(aio.Client.job_log)
    attempt_usage = _blocking(aio.Client.attempt_usage)
    follow_log = _blocking(aio.Client.follow_log)
    follow_log_messages = _blocking(aio.Client.follow_log_messages)
    job_groups = _blocking(aio.Client.job_groups)
    cancel_job_group = _blocking(aio.Client.cancel_job_group)
    hold = _blocking(aio.Client.hold)
    release = _blocking(aio.Client.release)
    delete_batch = _blocking(aio.Client.delete_batch)
    rerun_failed = _blocking(aio.Client.rerun_failed)
    locks = _blocking(aio.Client.locks)
    # Secrets of billing projects.
    create_secret = _blocking(aio.Client.create_secret)
    secrets = _blocking(aio.Client.secrets)
    delete_secret = _blocking(aio.Client.delete_secret)
    # Images of billing projects in corral's own registry.
    import_image = _blocking(aio.Client.import_image)
    images = _blocking(aio.Client.images)
    delete_image = _blocking(aio.Client.delete_image)
    # Billing projects.
    billing_projects = _blocking(aio.Client.billing_projects)
    billing_project = _blocking(aio.Client.billing_project)
    create_billing_project = _blocking(aio.Client.create_billing_project)
    add_member = _blocking(aio.Client.add_member)
    remove_member = _blocking(aio.Client.remove_member)
    set_limit = _blocking(aio.Client.set_limit)
    close_billing_project = _blocking(aio.Client.close_billing_project)
    reopen_billing_project = _blocking(aio.Client.reopen_billing_project)
    spend = _blocking(aio.Client.spend)
    reservations = _blocking(aio.Client.reservations)
    # Quotas and fair-share weights (set by administrators).
    set_quota = _blocking(aio.Client.set_quota)
    quotas = _blocking(aio.Client.quotas)
    # The fleet (administrators).
    pools = _blocking(aio.Client.pools)
    pause_pool = _blocking(aio.Client.pause_pool)
    resume_pool = _blocking(aio.Client.resume_pool)
    instances = _blocking(aio.Client.instances)
    # Users and tokens (the auth service).
    create_user = _blocking(aio.Client.create_user)
    users = _blocking(aio.Client.users)
    create_token = _blocking(aio.Client.create_token)
    deactivate_user = _blocking(aio.Client.deactivate_user)
