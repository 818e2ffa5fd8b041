"""Jobs on different workers, and of different deployments on one host,
cannot reach each other, whatever order the workers started in (issue 33,
part 1; docs/security.md, *What a job can reach*).

The attack: a job on worker B connected to a job listening on worker A.
Each worker inserts its jumps at the top of the host's chains, so before
the fix the newest worker's accept of its own public range matched before
the older worker's refusal of traffic into its bridge. Here two workers of
one deployment (one state root) and one of another (a state root of its
own) start in either order; on each a public job listens (and a private job
on the first), and from a public job on each worker every other worker's
listeners are tried, as is the stand-in internet (tests/oci/outside.py),
which must still answer. The host's own processes, as another local account
(`nobody`), cannot start a connection to a job either.
"""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from pathlib import Path

import pytest

from corral.batch.v1 import job_spec_pb2 as js
from services.worker.oci import OciRuntime
from services.worker.oci.network import PRIVATE, PUBLIC
from tests.oci.host import OciHost, fields, needs_oci, run, spec
from tests.oci.outside import HOST_SIDE, INTERNET, Outside, reach_from_host

pytestmark = [pytest.mark.timeout(120), needs_oci]

PORT = 9000
LISTEN_S = 14
"""How long each listener stays up: long enough for every caller's tries (nc's 3 s each, in parallel)."""


def listener(mode: int) -> js.JobSpec:
    """A job that answers every connection with "reached" for LISTEN_S seconds, and checks that it does by
    connecting to itself over its own loopback (which a job may always reach)."""
    return spec(f"nc -ll -p {PORT} -e echo reached & sleep 1; echo self=$(nc -w 2 127.0.0.1 {PORT} </dev/null); "
                f"sleep {LISTEN_S}; echo done=1", network_mode=mode)


def caller(targets: dict[str, str], outside_port: int) -> js.JobSpec:
    """A public job that tries every target on PORT, and the stand-in internet, at once."""
    lines = [f"(echo {name}=$(nc -w 3 {address} {PORT} </dev/null 2>/dev/null | head -n 1)) &"
             for name, address in targets.items()]
    lines.append(f"(echo internet=$(nc -w 3 {INTERNET} {outside_port} </dev/null 2>/dev/null | head -n 1)) &")
    return spec("\n".join(lines + ["wait"]), network_mode=js.NETWORK_MODE_PUBLIC)


def first_address(runtime: OciRuntime, mode: str) -> str:
    """The address a fresh runtime's first attempt of `mode` gets."""
    assert runtime._network is not None
    return str(runtime._network.addresses(mode)[0])


def connect_as_nobody(address: str) -> str:
    """What a local account other than corral's reads from a job's port (busybox-static's nc)."""
    done = subprocess.run(["/bin/busybox", "nc", "-w", "3", address, str(PORT)], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, user=65534, group=65534, extra_groups=[], timeout=10)
    return done.stdout.strip()


@pytest.mark.parametrize("order", ["older-first", "newer-first"])
async def test_no_job_reaches_a_job_of_another_worker_or_deployment(oci_host: OciHost, outside: Outside,
                                                                    tmp_path: Path, order: str) -> None:
    assert (await reach_from_host(INTERNET, outside.port)).startswith(f"reached-{INTERNET}-")
    other = OciHost(tmp_path / "other-deployment", oci_host.images)  # a state root of its own
    (tmp_path / "other-deployment").mkdir()
    try:
        a, b = oci_host.runtime(owner=f"a-{uuid.uuid4().hex[:6]}"), oci_host.runtime(owner=f"b-{uuid.uuid4().hex[:6]}")
        c = other.runtime(owner=f"c-{uuid.uuid4().hex[:6]}")
        for runtime in ([a, b, c] if order == "older-first" else [c, b, a]):
            await runtime.start()
        workers = {"a": a, "b": b, "c": c}
        listening = {name: first_address(r, PUBLIC) for name, r in workers.items()}
        listening["a_private"] = first_address(a, PRIVATE)
        listeners = [asyncio.create_task(run(r, oci_host.job(listener(js.NETWORK_MODE_PUBLIC), attempt_id=f"l{n}",
                                                             job_id=10 + i)))
                     for i, (n, r) in enumerate(workers.items())]
        listeners.append(asyncio.create_task(run(a, oci_host.job(listener(js.NETWORK_MODE_PRIVATE),
                                                                 attempt_id="lp", job_id=20))))
        await asyncio.sleep(2)  # the listeners are up (each checks itself: `self=reached` below)
        callers = {name: asyncio.create_task(run(r, oci_host.job(
            caller({t: address for t, address in listening.items() if not t.startswith(name)}, outside.port),
            attempt_id=f"c{name}", job_id=30 + i)))
                   for i, (name, r) in enumerate(workers.items())}
        host_tries = {t: await asyncio.to_thread(connect_as_nobody, address) for t, address in listening.items()}
        seen = {}
        for name, task in callers.items():
            outcome, log = await task
            assert outcome.state == "Success", (outcome, log)
            seen[name] = fields(log)
        for task in listeners:
            outcome, log = await task
            assert outcome.state == "Success" and fields(log) == {"self": "reached", "done": "1"}, (outcome, log)
    finally:
        for runtime in other.runtimes:
            await runtime.close()
        left = other.leftovers()
        await other.clean_up()
    assert left == []
    internet = f"reached-{INTERNET}-from-{HOST_SIDE}"
    assert seen == {"a": {"b": "", "c": "", "internet": internet},
                    "b": {"a": "", "a_private": "", "c": "", "internet": internet},
                    "c": {"a": "", "a_private": "", "b": "", "internet": internet}}
    assert host_tries == dict.fromkeys(listening, "")
