"""`corral up` supervises instead of collapsing, and nothing it started outlives it: the leading driver
killed with SIGKILL is survived (the standby leads, the killed one comes back as a standby, the batch
completes); a SIGKILL of `corral up` itself takes every process it started with it (services, MariaDB,
workers and their jobs), and the next `corral up` ends what a pid file says was left and runs the jobs that
ran again within seconds; a part that cannot be restarted stops everything with exit code 1; a clean stop
leaves nothing either."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import time
from pathlib import Path

import grpc
import pytest

import corral
from corral.driver.v1 import driver_service_pb2 as pb
from corral.driver.v1 import driver_service_pb2_grpc
from services.common.processes import PidFiles, PidRecord
from services.common.tls import TlsFiles
from tests.e2e import cluster as up
from tests.e2e.cluster import Cluster, eventually, processes

pytestmark = pytest.mark.timeout(300)


def records(pids: set[int]) -> list[PidRecord]:
    """Each live process among `pids`, named by its argv (a pid alone could be reused meanwhile)."""
    argv = processes()
    found = [PidRecord.of(" ".join(argv.get(pid, ["?"]))[:100], pid) for pid in pids]
    return [r for r in found if r is not None]


def still_running(started: list[PidRecord]) -> list[str]:
    return [f"{r.pid}: {r.name}" for r in started if r.alive()]


def driver_pid(cluster: Cluster, name: str) -> int:
    record = PidFiles(cluster.data_dir / "run" / "pids").read(name)
    assert record is not None and record.alive(), name
    return record.pid


def leader(cluster: Cluster) -> tuple[str, int]:
    """The leading driver's part name (`driver-I`) and the epoch."""
    [row] = cluster.query("SELECT leader_name, epoch FROM leader_epoch")
    drivers = cluster.endpoints["drivers"].split(",")
    return f"driver-{drivers.index(row['leader_name'])}", int(row["epoch"])


async def get_leader(cluster: Cluster, name: str) -> pb.GetLeaderResponse:
    """GetLeader on one driver, as the frontend asks it."""
    address = cluster.endpoints["drivers"].split(",")[int(name.split("-")[1])]
    tls = TlsFiles.of(cluster.data_dir / "certs" / "frontend", "frontend")
    async with grpc.aio.secure_channel(address, tls.channel_credentials()) as channel:
        return await driver_service_pb2_grpc.DriverServiceStub(channel).GetLeader(pb.GetLeaderRequest(), timeout=10)


def test_a_killed_leader_is_survived_and_a_clean_stop_leaves_nothing(tmp_path: Path) -> None:
    cluster = up.start(tmp_path, "--worker-cores", "2", "--max-workers", "2", "--idle-timeout", "120")
    try:
        builder = corral.BatchBuilder("default", attributes={"test": "leader-kill"})
        firsts = [builder.job("busybox", "sleep 4", cores=1) for _ in range(6)]
        for parent in firsts[:3]:
            builder.job("busybox", "echo after", cores=1, parents=[parent])
        with cluster.client() as client:
            batch_id = client.submit(builder).batch_id
            eventually(lambda: cluster.query("SELECT 1 FROM attempts WHERE batch_id = %s AND start_time_ms IS NOT "
                                             "NULL AND end_time_ms IS NULL", (batch_id,)),
                       timeout_s=90, what="jobs running")
            killed, epoch = leader(cluster)
            standby = "driver-1" if killed == "driver-0" else "driver-0"
            killed_pid = driver_pid(cluster, killed)
            workers = records(set(cluster.worker_pids().values()))
            assert workers, "the leader started workers"

            os.kill(killed_pid, signal.SIGKILL)
            done = client.wait(batch_id)
        assert done.counts.n_succeeded == 9, done.counts

        # corral up said what happened, and restarted the killed driver.
        assert cluster.said(f"{killed} (pid {killed_pid}) exited with -9 (killed by SIGKILL)")

        def serves_again() -> bool:
            return any(line.startswith(f"{killed} (pid ") and "serves again" in line for line in list(cluster.output))

        eventually(serves_again, timeout_s=60, what=f"{killed} to serve again")
        restarted_pid = driver_pid(cluster, killed)
        assert restarted_pid != killed_pid
        # One driver leads under the next epoch and the other stands by and names it. Usually the standby
        # leads, but the restarted driver may campaign first: the lease's holder is gone, and the first to
        # look takes it (seen once in a loaded suite).
        new_leader, new_epoch = leader(cluster)
        assert new_epoch == epoch + 1 and new_leader in (standby, killed)
        other = standby if new_leader == killed else killed
        answer = asyncio.run(get_leader(cluster, other))
        assert not answer.is_leader
        assert answer.leader_address == cluster.endpoints["drivers"].split(",")[int(new_leader[-1])]
        # The workers the killed leader started kept serving: a worker is a machine, not its driver's child.
        assert all(worker.alive() for worker in workers), still_running(workers)
        assert cluster.process.poll() is None

        started = records(cluster.descendants() | set(cluster.worker_pids().values()))
        assert any("mariadbd" in r.name for r in started) and any("services.worker" in r.name for r in started)
    except BaseException:
        cluster.stop()
        raise
    assert cluster.stop() == 0
    # Everything it started is gone when it exits, the workers the dead driver left included.
    assert not still_running(started)
    assert cluster.said("waiting for worker-")
    assert cluster.output[-1].strip() == "corral stopped."


def test_nothing_outlives_a_killed_corral_up_and_the_next_one_ends_what_was_left(tmp_path: Path) -> None:
    cluster = up.start(tmp_path, "--worker-cores", "2", "--max-workers", "1")
    try:
        builder = corral.BatchBuilder("default", attributes={"test": "up-sigkill"})
        for _ in range(2):
            builder.job("busybox", "sleep 600", cores=1)
        with cluster.client() as client:
            batch_id = client.submit(builder).batch_id
        eventually(lambda: len(cluster.query("SELECT 1 FROM attempts WHERE batch_id = %s AND start_time_ms IS NOT "
                                             "NULL", (batch_id,))) == 2, timeout_s=90, what="both jobs running")
        started = records(cluster.descendants())
        names = " | ".join(r.name for r in started)
        for part in ("mariadbd", "services.auth", "services.frontend", "services.driver", "services.worker",
                     "launcher.py"):
            assert part in names, f"{part} not among {names}"
    finally:
        cluster.process.kill()  # SIGKILL: corral up can do nothing more
        cluster.wait()

    eventually(lambda: not still_running(started), timeout_s=30,
               what="every process the killed corral up started to end by itself")

    # What a killed corral up could still have left (here, made by hand): the next one ends it, and
    # leaves alone a process that merely has a recorded pid (its start time differs).
    pid_files = PidFiles(tmp_path / "data" / "run" / "pids")
    decoy = os.posix_spawnp("sleep", ["sleep", "600"], dict(os.environ))
    pid_files.record("worker-decoy", decoy)
    bystander = os.getpid()
    (pid_files.directory / "driver-0.pid").write_text(
        json.dumps({"pid": bystander, "start_ticks": PidRecord.of("me", bystander).start_ticks + 1}))  # type: ignore[union-attr]
    restarted_ms = time.time() * 1000
    again = up.start(tmp_path)
    ready_s = time.monotonic()
    try:
        assert again.said(f"ending what an earlier corral up left running: worker-decoy (pid {decoy})")
        assert os.waitpid(decoy, os.WNOHANG)[0] == decoy  # ended (our child: reaped here)
        assert not again.said(f"(pid {bystander})")
        with again.client() as client:
            assert client.get_batch(batch_id).state  # the database came back with its data
        # The killed run's workers could not deactivate: the new leader ends their instances as soon as it
        # leads (their processes are gone), and both jobs run again within seconds, not after deadlines.
        eventually(lambda: len(again.query("SELECT 1 FROM attempts WHERE batch_id = %s AND start_time_ms >= %s",
                                           (batch_id, restarted_ms))) == 2,
                   timeout_s=max(1.0, ready_s + 10 - time.monotonic()), what="both jobs running again within 10 s")
        ended = again.query("SELECT DISTINCT i.deactivation_reason FROM attempts a JOIN instances i "
                            "ON i.name = a.instance_name WHERE a.batch_id = %s AND a.start_time_ms < %s",
                            (batch_id, restarted_ms))
        assert ended == [{"deactivation_reason": "its machine has ended"}], ended
    finally:
        assert again.stop() == 0


def test_a_part_that_cannot_be_restarted_stops_everything(tmp_path: Path) -> None:
    cluster = up.start(tmp_path, "--restart-tries", "1")
    holder = socket.socket()
    try:
        standby = "driver-1" if leader(cluster)[0] == "driver-0" else "driver-0"
        port = json.loads((tmp_path / "data" / "run" / f"{standby}.ports").read_text())["internal"]
        started = records(cluster.descendants())
        pid = driver_pid(cluster, standby)
        os.kill(pid, signal.SIGKILL)
        eventually(lambda: PidRecord.of("", pid) is None, timeout_s=10, what="the driver to die")
        # Something else takes its port: it cannot come back.
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

        def taken() -> bool:  # the dead driver's listener may take a moment to be released
            try:
                holder.bind(("127.0.0.1", port))
            except OSError:
                return False
            return True

        eventually(taken, timeout_s=10, what="the dead driver's port to be free")
        holder.listen()
        code = cluster.wait(timeout_s=180)
    finally:
        holder.close()
        if cluster.process.poll() is None:
            cluster.stop()
    assert code == 1
    assert cluster.said(f"{standby} (pid {pid}) exited with -9 (killed by SIGKILL)")
    assert cluster.said("could not be kept running")
    assert cluster.output[-1].startswith("corral stopped: ")
    assert not still_running(started)
