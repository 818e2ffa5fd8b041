"""Both container runtimes the OCI runtime drives, crun (in the foreground) and
runc (detached, its job reaped by the keeper as a subreaper), give the same
outcomes: the other modules' tests run with whichever `auto` chooses here,
these with each one that is installed and can run on this host. And the
keeper: one per runtime, reused by every attempt, started again if it died."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from services.worker.oci.runc import CRUN, RUNC, choose
from tests.job_processes import marked, processes_marked, processes_marked_soon
from tests.oci.host import OciHost, needs_oci, run, spec, start

pytestmark = [needs_oci, pytest.mark.timeout(120)]

KINDS = [pytest.param(kind, marks=pytest.mark.skipif(bool(choose(kind)[1]), reason="; ".join(choose(kind)[1])))
         for kind in (CRUN, RUNC)]


@pytest.mark.parametrize("kind", KINDS)
async def test_each_runtime_gives_the_same_outcomes(oci_host: OciHost, kind: str) -> None:
    runtime = oci_host.runtime(container_runtime=kind)
    ok, log = await run(runtime, oci_host.job(spec("echo 1; echo 2 >&2; echo 3; ls /nowhere; echo 5"), "a1"))
    assert (ok.state, ok.exit_code, ok.error_message) == ("Success", 0, "")
    assert log == "1\n2\n3\nls: /nowhere: No such file or directory\n5\n"  # one pipe, in the order written
    assert f"OCI container ({kind})" in ok.isolation
    failed, _ = await run(runtime, oci_host.job(spec("exit 3"), "a2"))
    assert (failed.state, failed.exit_code, failed.error_message) == ("Failed", 3, "exited with code 3")
    killed, _ = await run(runtime, oci_host.job(spec("sh -c 'kill -SEGV $$'; exit $?"), "a3"))
    assert (killed.state, killed.exit_code) == ("Failed", 139)
    never, _ = await run(runtime, oci_host.job(spec("", "/no/such/program"), "a4"))
    assert (never.state, never.end_reason, never.start_time_ms) == ("Error", "system_error", None)
    assert "no such file or directory" in never.error_message.lower()


@pytest.mark.parametrize("kind", KINDS)
async def test_each_runtime_stops_a_cancelled_container(oci_host: OciHost, kind: str) -> None:
    runtime = oci_host.runtime(container_runtime=kind, kill_grace_s=0.5)
    job_spec, mark = marked(spec("trap '' TERM; sleep 30"))
    task, _, started = start(runtime, oci_host.job(job_spec))
    await started.wait()
    assert await processes_marked_soon(mark)
    await runtime.cancel("a1")
    outcome = await task
    assert (outcome.state, outcome.end_reason) == ("Cancelled", "cancelled")
    assert not processes_marked(mark)


async def test_one_keeper_serves_every_attempt_and_a_dead_one_is_replaced(oci_host: OciHost) -> None:
    runtime = oci_host.runtime()
    # Many at once: an answer waiting on the keeper's socket for the thread that asked is no sign of its death.
    outcomes = await asyncio.gather(*(run(runtime, oci_host.job(spec("true"), f"a{i}")) for i in range(24)))
    assert [outcome.state for outcome, _ in outcomes] == ["Success"] * 24
    keeper = runtime._keeper
    assert keeper is not None and keeper.alive
    first = keeper.proc.pid
    os.kill(first, signal.SIGKILL)
    keeper.proc.wait()
    outcome, _ = await run(runtime, oci_host.job(spec("true"), "b1"))
    assert outcome.state == "Success"
    assert runtime._keeper is not None and runtime._keeper.proc.pid != first

