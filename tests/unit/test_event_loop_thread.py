"""The event loop thread the blocking client runs the asyncio client on: results and exceptions come back
as they are, an interrupted caller cancels its call, iterators close their async source when they stop,
and closing ends the thread. No network: plain coroutines and async generators."""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from corral.errors import NotFound, UsageError
from corral.event_loop_thread import EventLoopThread

WAIT_S = 10.0


@pytest.fixture
def loop() -> Iterator[EventLoopThread]:
    running = EventLoopThread("test loop")
    try:
        yield running
    finally:
        running.close()


class Source:
    """An async generator of 0, 1, 2, ... that records, on the loop's thread, how it ended."""

    def __init__(self, n_items: int | None = None, slow_close: bool = False):
        self.n_items = n_items
        self.slow_close = slow_close
        self.started = threading.Event()
        self.closed = threading.Event()
        self.cancelled = threading.Event()
        self.closed_on: threading.Thread | None = None

    async def items(self) -> AsyncIterator[int]:
        n = 0
        try:
            while self.n_items is None or n < self.n_items:
                if n == 1:
                    self.started.set()
                    await asyncio.sleep(3600 if self.n_items is None else 0)  # the second item never comes
                yield n
                n += 1
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        finally:
            if self.slow_close:
                await asyncio.sleep(0.01)  # cleanup that awaits: a close must wait for it
            self.closed_on = threading.current_thread()
            self.closed.set()


def test_results_and_typed_exceptions_come_back_as_they_are(loop: EventLoopThread) -> None:
    async def answer() -> tuple[str, bool]:
        return threading.current_thread().name, asyncio.get_running_loop().is_running()

    async def refuse() -> None:
        raise NotFound("no batch 7")

    assert loop.run(answer()) == ("test loop", True)
    with pytest.raises(NotFound, match="no batch 7") as error:
        loop.run(refuse())
    assert error.value.code.name == "NOT_FOUND"


def test_opening_and_closing_many_leaves_no_thread_behind() -> None:
    before = threading.active_count()
    loops = [EventLoopThread(f"loop {n}") for n in range(50)]
    assert threading.active_count() == before + 50
    for running in loops:
        running.close()
        running.close()  # a second close is a no-op
    assert threading.active_count() == before
    assert all(running._loop.is_closed() for running in loops)


def test_a_closed_loop_refuses_work_without_leaving_it_unawaited(loop: EventLoopThread) -> None:
    loop.close()

    async def work() -> None:
        raise AssertionError("never runs")

    with pytest.raises(UsageError, match="test loop is closed"):
        loop.run(work())  # and no "coroutine was never awaited" (warnings are errors)


def test_closing_runs_the_last_coroutine_on_the_loop_and_raises_its_error_here() -> None:
    running = EventLoopThread("test loop")
    seen: list[str] = []

    async def last() -> None:
        seen.append(threading.current_thread().name)
        raise OSError("channel would not close")

    with pytest.raises(OSError, match="would not close"):
        running.close(last)
    assert seen == ["test loop"]
    assert not running._thread.is_alive()


def test_closing_cancels_what_another_thread_still_waits_for(loop: EventLoopThread) -> None:
    source = Source()
    failed: list[BaseException] = []

    def wait_for_ever() -> None:
        try:
            list(loop.iterate(source.items()))
        except BaseException as e:  # what this thread saw is the point
            failed.append(e)

    waiter = threading.Thread(target=wait_for_ever)
    waiter.start()
    assert source.started.wait(WAIT_S)
    loop.close()
    waiter.join(WAIT_S)
    assert [type(e) for e in failed] == [UsageError] and "closed during the call" in str(failed[0])
    assert source.cancelled.is_set() and source.closed.is_set()


def test_a_blocking_call_from_the_loops_own_thread_fails_instead_of_hanging(loop: EventLoopThread) -> None:
    async def inner() -> int:
        return 1

    async def outer() -> int:
        return loop.run(inner())  # blocking the loop that would have to run `inner`

    with pytest.raises(RuntimeError, match="would wait for ever"):
        loop.run(outer())


async def test_it_works_from_a_thread_that_runs_an_asyncio_loop_itself(loop: EventLoopThread) -> None:
    async def where() -> str:
        return threading.current_thread().name

    assert loop.run(where()) == "test loop"  # blocks this test's loop for the call, as any blocking call does
    assert [n for n in loop.iterate(Source(n_items=3).items())] == [0, 1, 2]


def test_stopping_early_closes_the_async_source_on_the_loop(loop: EventLoopThread) -> None:
    explicit = Source()
    items = loop.iterate(explicit.items())
    assert next(items) == 0
    assert not explicit.closed.is_set()
    items.close()
    assert explicit.closed.is_set() and explicit.closed_on is loop._thread

    dropped = Source(n_items=10)
    for n in loop.iterate(dropped.items()):
        if n == 2:
            break  # the iterator is dropped here, and closed at once
    assert dropped.closed.is_set()

    exhausted = Source(n_items=3)
    assert list(loop.iterate(exhausted.items())) == [0, 1, 2] and exhausted.closed.is_set()


def test_closing_the_loop_closes_iterators_left_open(loop: EventLoopThread) -> None:
    source = Source(n_items=10)
    items = loop.iterate(source.items())
    assert next(items) == 0
    loop.close()
    assert source.closed.is_set()
    with pytest.raises(UsageError):
        next(items)


@pytest.fixture
def interrupt_main_thread() -> Iterator[Callable[[threading.Event], None]]:
    """`interrupt(when)`: a SIGINT to this (the main) thread once `when` is set, as Ctrl-C would."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("needs the main thread with Python's own SIGINT handler")
    senders: list[threading.Thread] = []

    def interrupt(when: threading.Event) -> None:
        def send() -> None:
            if when.wait(WAIT_S):
                signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)  # type: ignore[arg-type]
        sender = threading.Thread(target=send)
        sender.start()
        senders.append(sender)

    yield interrupt
    for sender in senders:
        sender.join()


def test_ctrl_c_cancels_the_call_on_the_loop_at_once(loop: EventLoopThread, interrupt_main_thread) -> None:
    started, cancelled = threading.Event(), threading.Event()

    async def for_ever() -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    interrupt_main_thread(started)
    with pytest.raises(KeyboardInterrupt):  # long before the hour is up
        loop.run(for_ever())
    assert cancelled.wait(WAIT_S)


def test_ctrl_c_in_an_iterator_closes_its_source_cleanly(loop: EventLoopThread, interrupt_main_thread) -> None:
    source = Source(slow_close=True)  # its cleanup awaits: the close waits for the cancelled step to finish
    interrupt_main_thread(source.started)
    with pytest.raises(KeyboardInterrupt):  # not "asynchronous generator is already running"
        for _ in loop.iterate(source.items()):
            pass
    assert source.cancelled.is_set() and source.closed.is_set()
