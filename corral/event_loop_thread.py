"""An asyncio event loop in a daemon thread of its own, that blocking code calls coroutines on.

`corral.Client` is `corral.aio.Client` driven through one of these. A
grpc.aio channel belongs to the loop it was created on, so the loop stays
the same for the client's whole life, in a thread of its own: callers on
any thread (several threads of a pool, or a thread already running an
asyncio loop of its own) hand it a coroutine and block until its answer.

A caller interrupted while it waits (Ctrl-C in the main thread raises
KeyboardInterrupt there) cancels the coroutine on the loop, so nothing it
asked for runs on behind its back. An async iterator is driven one step per
item, and closing the blocking iterator (or dropping it) closes the async
one on the loop; `close()` stops the loop: it cancels whatever still runs,
closes every async generator still open and ends the thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Generator
from typing import Any, Generic, TypeVar

from corral.errors import UsageError

T = TypeVar("T")

_END: Any = object()
"""What a step answers once the async iterator is exhausted."""


class EventLoopThread:
    """A running event loop and its thread, until `close()`. `name` names the thread and, in errors, the
    object whose loop it is."""

    def __init__(self, name: str):
        self.name = name
        self._loop = asyncio.new_event_loop()
        self._stop_requested = asyncio.Event()
        self._last: Callable[[], Awaitable[None]] | None = None
        self._lock = threading.Lock()
        """Held to schedule work and to close: nothing is scheduled on a loop that is shutting down."""
        self._closed = False
        self._last_error: Exception | None = None
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        # The Runner's exit cancels what still runs, closes the open async
        # generators, stops the default executor and closes the loop.
        with asyncio.Runner(loop_factory=lambda: self._loop) as runner:
            runner.run(self._until_stopped())

    async def _until_stopped(self) -> None:
        await self._stop_requested.wait()
        if self._last is not None:
            try:
                await self._last()
            except Exception as e:  # for close() to raise in its caller's thread, not to end this one
                self._last_error = e

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run `coroutine` on the loop and return its result (or raise its exception) here.

        Raises UsageError once the thread is closed (the coroutine is then
        not run), and RuntimeError on the loop's own thread, where waiting
        would never end."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        try:  # from before it is scheduled: an interruption at any point cancels it
            with self._lock:
                if self._closed or threading.current_thread() is self._thread:
                    coroutine.close()  # never to run: not "never awaited" either
                    if self._closed:
                        raise UsageError(f"{self.name} is closed")
                    raise RuntimeError(f"a blocking call of {self.name} on its own event loop would wait for ever")
                self._loop.call_soon_threadsafe(self._start, coroutine, future)
            return future.result()
        except concurrent.futures.CancelledError:  # closed (from another thread) while it ran
            raise UsageError(f"{self.name} was closed during the call") from None
        except BaseException:  # KeyboardInterrupt here: the call must not run on there
            future.cancel()
            raise

    def _start(self, coroutine: Coroutine[Any, Any, T], future: concurrent.futures.Future[T]) -> None:
        """On the loop: run `coroutine` as a task that settles `future`, and that cancelling `future`
        cancels (what asyncio.run_coroutine_threadsafe does, but with the future made before scheduling)."""
        task = self._loop.create_task(coroutine)
        task.add_done_callback(functools.partial(_settle, future))

        def cancel_task(_: concurrent.futures.Future[T]) -> None:
            if future.cancelled():  # by its caller, on the caller's thread
                self._loop.call_soon_threadsafe(task.cancel)

        future.add_done_callback(cancel_task)

    def iterate(self, source: AsyncIterator[T]) -> Generator[T, None, None]:
        """`source`'s items, each awaited on the loop when asked for. Closing this iterator closes `source`
        there (dropping it does too, at once in CPython); closing the thread closes both."""
        steps = _Steps(source)
        try:
            while (item := self.run(steps.next())) is not _END:
                yield item
        finally:
            # From the loop's own thread (a garbage collection there) it
            # cannot wait: the loop closes `source` when it is collected.
            if threading.current_thread() is not self._thread:
                with contextlib.suppress(UsageError):  # closed meanwhile: the loop closed `source`
                    self.run(steps.close())

    def close(self, last: Callable[[], Awaitable[None]] | None = None) -> None:
        """Await `last()` on the loop (raising here what it raised), then cancel what still runs there,
        close its open async generators, close the loop and wait for the thread to end (not when called
        on that thread: it ends on its own). A no-op once closed."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._last = last
            self._loop.call_soon_threadsafe(self._stop_requested.set)
        if threading.current_thread() is not self._thread:
            self._thread.join()
            if self._last_error is not None:
                raise self._last_error


def _settle(future: concurrent.futures.Future[T], task: asyncio.Task[T]) -> None:
    """`task`'s outcome, as `future`'s, unless its caller gave up on it."""
    if task.cancelled():
        future.cancel()
    elif future.set_running_or_notify_cancel():  # False: cancelled by its caller, who no longer waits
        error = task.exception()
        if error is None:
            future.set_result(task.result())
        else:
            future.set_exception(error)


class _Steps(Generic[T]):
    """An async iterator's steps, one at a time. Closing it cancels a step still under way (one that its
    caller gave up on: the blocking iterator closes only once nobody waits for a step) and waits for
    that step to unwind, instead of failing with "already running"."""

    def __init__(self, source: AsyncIterator[T]):
        self._source = source
        self._lock = asyncio.Lock()
        self._step: asyncio.Task[Any] | None = None

    async def next(self) -> T:
        async with self._lock:
            self._step = asyncio.current_task()
            try:
                return await anext(self._source, _END)
            finally:
                self._step = None

    async def close(self) -> None:
        if self._step is not None and not self._step.cancelling():  # twice would cut its cleanup short
            self._step.cancel()
        async with self._lock:
            aclose = getattr(self._source, "aclose", None)
            if aclose is not None:
                await aclose()
