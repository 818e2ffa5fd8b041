"""What a job may take of its worker's host (issue 33, part 2), the pure
parts: the process caps' arithmetic and its promises (the shares of the
attempts a worker can hold never add up to more than its cap), what a
refused fork means, how an attempt ends at a limit, the check's pacing; the
settings as options; the limit watch; the scratch walk."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from services.common.worker_limits import WorkerLimits, add_arguments, deployment_of_data_dir
from services.worker.disk import used_bytes
from services.worker.host_limits import (XFSZ_EXIT_CODE, ProcessCount, attempt_max_processes,
                                         default_deployment_max_processes, deployment_share, ended_at_a_limit,
                                         filled_a_full_cap, hit_own_limit, next_check_delay_s, over_storage,
                                         refused_by_others, worker_max_processes)
from services.worker.limit_watch import Check, LimitWatch

MIB = 2**20
cores = st.integers(min_value=1, max_value=256_000)


def test_the_documented_defaults() -> None:
    """A 2-core worker (corral up's) holds 3,072 processes; a 1-core job a half of it; a 16-core worker 17,408."""
    assert worker_max_processes(2000, 1024, 1024) == 3072
    assert attempt_max_processes(1000, 2000, 3072, 4096) == 1536
    assert attempt_max_processes(250, 2000, 3072, 4096) == 384
    assert worker_max_processes(16_000, 1024, 1024) == 17_408
    assert attempt_max_processes(16_000, 16_000, 17_408, 4096) == 4096  # the per-job cap stays the most
    assert default_deployment_max_processes(32768) == 16384


@given(cores, st.integers(min_value=0, max_value=10_000), st.integers(min_value=0, max_value=100_000),
       st.integers(min_value=1, max_value=1000))
def test_a_workers_cap_grows_with_its_cores_from_its_base(worker_cores: int, per_core: int, base: int,
                                                          more: int) -> None:
    cap = worker_max_processes(worker_cores, per_core, base)
    assert cap >= base + worker_cores * per_core // 1000
    assert worker_max_processes(worker_cores + more, per_core, base) >= cap


@given(cores, st.integers(min_value=1, max_value=10_000), st.integers(min_value=0, max_value=100_000),
       st.integers(min_value=1, max_value=100_000), st.data())
def test_the_shares_of_what_a_worker_can_hold_add_up_to_at_most_its_cap(
        worker_cores: int, per_core: int, base: int, per_job: int, data: st.DataObject) -> None:
    cap = worker_max_processes(worker_cores, per_core, base)
    jobs: list[int] = []
    left = worker_cores
    while left > 0 and len(jobs) < 12:  # jobs whose cores fit the worker together, as the agent admits them
        job = data.draw(st.integers(min_value=1, max_value=left))
        jobs.append(job)
        left -= job
    shares = [attempt_max_processes(job, worker_cores, cap, per_job) for job in jobs]
    assert all(1 <= share <= per_job for share in shares)
    if all(cap * job // worker_cores >= 1 for job in jobs):  # no share raised to the floor of one
        assert sum(shares) <= cap


@given(st.integers(min_value=0, max_value=10), st.integers(min_value=0, max_value=5000),
       st.one_of(st.none(), st.integers(min_value=0, max_value=5000)), st.integers(min_value=1, max_value=5000),
       st.booleans())
def test_a_refused_fork_is_the_jobs_own_limit_or_anothers(refused: int, current: int, peak: int | None,
                                                          limit: int, known: bool) -> None:
    count = ProcessCount(refused=refused, current=current, peak=peak, limit=limit, refusals_known=known)
    assert not (hit_own_limit(count) and refused_by_others(count))
    at_cap = max(current, peak or 0) >= limit
    assert (hit_own_limit(count) or refused_by_others(count)) == (refused > 0 or (not known and at_cap))
    if (refused or not known) and at_cap:
        assert hit_own_limit(count)
    if not known and not at_cap:
        assert not hit_own_limit(count)  # an unknown count blames only a job that reached its own cap


@given(st.lists(cores, min_size=1, max_size=8), st.integers(min_value=1, max_value=100_000), st.data())
def test_the_shares_of_a_full_deployment_add_up_to_at_most_its_cap(workers: list[int], deployment_cap: int,
                                                                    data: st.DataObject) -> None:
    """Workers of any sizes on one host, each full of jobs: when the deployment's cap is full, the shares its
    attempts may hold add up to at most the cap (but for shares raised to the floor of one), and no share is
    more than the attempt's own cap."""
    caps = [worker_max_processes(w, 1024, 1024) for w in workers]
    total = 0
    floors = 0
    for worker_cores, cap in zip(workers, caps):
        left = worker_cores
        for n in range(8):  # at most eight jobs a worker, the last taking what is left
            job = left if n == 7 else data.draw(st.integers(min_value=1, max_value=left))
            left -= job
            share = deployment_share(job, worker_cores, cap, deployment_cap, caps)
            assert share <= attempt_max_processes(job, worker_cores, cap, cap)
            floors += share == 1
            total += share
            if left == 0:
                break
    assert total <= deployment_cap + floors
    assert deployment_share(500, 2000, 300, 10**6, caps) == attempt_max_processes(500, 2000, 300, 300)


def test_who_filled_a_full_cap() -> None:
    refused_at_40 = ProcessCount(refused=2, current=3, peak=40, limit=150)
    assert filled_a_full_cap(refused_at_40, share=30) and not filled_a_full_cap(refused_at_40, share=41)
    quiet = ProcessCount(refused=0, current=40, peak=40, limit=150)  # v1: no refusal, nothing to judge
    assert not filled_a_full_cap(quiet, share=30)
    assert filled_a_full_cap(quiet, share=30, ancestor_full_now=True)  # v2 since 6.11: counted at the full cap
    own = ProcessCount(refused=2, current=150, peak=150, limit=150)
    assert not filled_a_full_cap(own, share=30)  # its own cap: the other words
    assert ended_at_a_limit(1, refused_at_40, 0, 0, "exited with code 1", share=30, deployment_limit=120) == (
        "Failed", "hit its process limit: the deployment's 120 processes and threads (pids.max) were all taken, "
                  "and it held at least its share of them, 30; the command exited with code 1")
    assert ended_at_a_limit(1, refused_at_40, 0, 0, "exited with code 1", share=50)[0] == "Error"


def test_how_an_attempt_ends_at_a_limit() -> None:
    at_cap = ProcessCount(refused=3, current=10, peak=75, limit=75)
    below = ProcessCount(refused=3, current=10, peak=40, limit=75)
    none = ProcessCount(refused=0, current=10, peak=75, limit=75)
    assert ended_at_a_limit(0, at_cap, 0, 0, "exited with code 0") is None  # it coped: it succeeded
    assert ended_at_a_limit(2, none, 0, 0, "exited with code 2") is None
    assert ended_at_a_limit(2, at_cap, 0, 0, "exited with code 2") == (
        "Failed", "hit its process limit: the kernel refused a fork at its limit of 75 processes and threads "
                  "(the cgroup's pids.max); the command exited with code 2")
    state, words = ended_at_a_limit(2, below, 0, 0, "exited with code 2")
    assert state == "Error" and "the worker's or the deployment's process limit (pids.max)" in words
    assert ended_at_a_limit(0, none, 16 * MIB - 1, 16 * MIB, "exited with code 0") is None
    assert ended_at_a_limit(0, none, 16 * MIB, 16 * MIB, "exited with code 0") == (
        "Failed", "wrote more than its storage request of 16 MiB (storage_bytes): 16 MiB in its scratch when it "
                  "ended; the command exited with code 0")
    state, words = ended_at_a_limit(XFSZ_EXIT_CODE, None, MIB, 16 * MIB, "killed by SIGXFSZ (exit code 153)")
    assert state == "Failed" and "(SIGXFSZ)" in words
    assert ended_at_a_limit(XFSZ_EXIT_CODE, None, MIB, 0, "killed by SIGXFSZ (exit code 153)") is None
    assert not over_storage(10**18, 0)  # no request: not enforced


@given(st.floats(min_value=0.01, max_value=60), st.floats(min_value=0, max_value=60))
def test_a_slow_check_waits_ten_times_its_own_time(interval_s: float, took_s: float) -> None:
    delay = next_check_delay_s(interval_s, took_s)
    assert delay >= interval_s and delay >= 10 * took_s
    assert delay == max(interval_s, 10 * took_s)


@given(st.builds(WorkerLimits, deployment=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,20}", fullmatch=True),
                 deployment_max_processes=st.integers(0, 10**6), max_processes_per_core=st.integers(1, 10**5),
                 max_processes_base=st.integers(0, 10**5), max_processes_per_job=st.integers(1, 10**5),
                 process_check_interval_s=st.floats(0.01, 100), storage_check_interval_s=st.floats(0.01, 100)))
def test_the_settings_go_through_a_command_line(limits: WorkerLimits) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert limits.problems() == []
    assert WorkerLimits.from_args(parser.parse_args(limits.to_args())) == limits
    assert WorkerLimits.from_args(parser.parse_args([])) == WorkerLimits()
    assert WorkerLimits().to_args() == []  # a default command line is unchanged


def test_settings_refused_name_their_option(tmp_path: Path) -> None:
    bad = WorkerLimits(deployment="../etc", max_processes_per_job=0, deployment_max_processes=-1,
                       storage_check_interval_s=0)
    assert bad.problems() == ["--deployment '../etc': letters, digits, '.', '_' and '-', at most 64",
                              "--deployment-max-processes must not be negative",
                              "--max-processes-per-job must be at least 1",
                              "--storage-check-interval must be positive"]
    named = deployment_of_data_dir(tmp_path / "data")
    assert WorkerLimits(deployment=named).problems() == [] and named.startswith("up-")
    assert named == deployment_of_data_dir(tmp_path / "x" / ".." / "data") != deployment_of_data_dir(tmp_path)


async def test_the_watch_returns_the_first_limit_passed_and_survives_a_failing_check(
        caplog: pytest.LogCaptureFixture) -> None:
    readings = iter([None, None, "over"])
    ran: list[str] = []

    def broken() -> str | None:
        raise OSError("the cgroup went away")

    watch = LimitWatch([Check("storage", 0.01, lambda: next(readings), in_thread=True),
                        Check("processes", 0.005, broken)], on_cycle=ran.append)
    with caplog.at_level(logging.ERROR):
        assert await asyncio.wait_for(watch.run(), 5) == "over"
    assert ran.count("storage") == 3 and ran.count("processes") >= 1
    assert "the processes check of a running attempt failed" in caplog.text


def test_the_scratch_walk(tmp_path: Path) -> None:
    top = tmp_path / "upper"
    top.mkdir()
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(1500):  # deeper than Python would recurse
        os.mkdir("d", dir_fd=fd)
        fd, parent = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd), fd
        os.close(parent)
    try:
        with open(os.open("f", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd), "wb") as f:
            f.write(b"x" * MIB)
        os.link("f", top / "same-file", src_dir_fd=fd)  # counted once
        os.close(fd)
        with open(top / "sparse", "wb") as f:
            f.truncate(10**9)  # a gigabyte long, nothing in it
        (top / "away").symlink_to(tmp_path / "outside")
        (tmp_path / "outside").write_bytes(b"y" * 4 * MIB)  # not followed
        used = used_bytes([top])
        assert MIB <= used < MIB + 1500 * 8192
        assert used_bytes([top], owner_uid=os.getuid() + 1) == 0
        assert used_bytes([tmp_path / "missing"]) == 0
    finally:
        _remove_deep(top / "d", 1500)  # shutil.rmtree, which pytest's cleanup uses, recurses: it would fail


def _remove_deep(top: Path, depth: int) -> None:
    """Remove `top`/d/d/.../f, `depth` directories, deepest first (the whole path stays under PATH_MAX)."""
    path = str(top) + "/d" * (depth - 1)
    if os.path.exists(path + "/f"):
        os.unlink(path + "/f")
    for _ in range(depth):
        os.rmdir(path)
        path = path.rsplit("/", 1)[0]
