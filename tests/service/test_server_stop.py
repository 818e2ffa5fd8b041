"""Stopping a server ends its health watch whenever the cancellation lands: even as the
database probe answers, which `asyncio.wait_for` on Python 3.11 swallowed (CPython
gh-86296), so the watch ran on and `stop()` waited for it forever."""

from __future__ import annotations

import asyncio

import pytest

from services.common.server import Listener, serve
from services.common.tls import DevCertificateAuthority


@pytest.mark.parametrize("turns", range(8))
async def test_stop_ends_the_health_watch_even_as_the_probe_answers(certs: DevCertificateAuthority,
                                                                    turns: int) -> None:
    servers = await serve([], [Listener.mutual_tls("127.0.0.1:0", certs.issue("frontend"))])
    probing, answer = asyncio.Event(), asyncio.Event()

    async def probe() -> None:
        probing.set()
        await answer.wait()

    servers.watch_health(probe, period_s=60.0)
    await probing.wait()
    answer.set()
    for _ in range(turns):  # let the answer travel some of the way before the stop cancels the watch
        await asyncio.sleep(0)
    stopping = asyncio.create_task(servers.stop(grace_s=0))
    # asyncio.wait does not cancel what it waits for: a timeout here would cancel the watch a second time and
    # hide the hang.
    done, _ = await asyncio.wait({stopping}, timeout=10)
    assert stopping in done, "stop() still waits for the health watch"
    await stopping
