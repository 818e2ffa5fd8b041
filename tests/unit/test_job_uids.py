"""Claims of job uids (services/worker/job_uids.py): unique while held, across
processes; free again once released or once the holder died; never while a
process still runs with the uid."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from services.worker.job_uids import JobUids, NoFreeUid, uids_in_use

pytestmark = pytest.mark.timeout(30)

FIRST = 2_100_000_000  # well apart from the runtime's default range, so real attempts never collide


def test_claims_are_unique_until_released(tmp_path: Path) -> None:
    uids = JobUids(tmp_path / "claims", FIRST, 2, in_use=lambda: ())
    a, b = uids.claim(), uids.claim()
    assert {a.uid, b.uid} == {FIRST, FIRST + 1}
    with pytest.raises(NoFreeUid, match=f"all 2 job uids from {FIRST} are in use"):
        uids.claim()
    a.release()
    a.release()  # idempotent
    again = uids.claim()
    assert again.uid == a.uid
    assert oct((tmp_path / "claims").stat().st_mode & 0o777) == "0o700"


def test_a_claim_is_seen_by_other_processes_and_freed_when_released(tmp_path: Path) -> None:
    uids = JobUids(tmp_path / "claims", FIRST, 1, in_use=lambda: ())
    claim = uids.claim()
    with open(tmp_path / "claims" / str(claim.uid), "rb") as f:
        with pytest.raises(BlockingIOError):
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        claim.release()
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_a_claim_whose_holder_died_is_free_again(tmp_path: Path) -> None:
    """A worker that crashes holding a claim: the kernel drops its lock."""
    claims = tmp_path / "claims"
    with holding(claims) as holder:
        uids = JobUids(claims, FIRST, 1, in_use=lambda: ())
        with pytest.raises(NoFreeUid):
            uids.claim()
        holder.send_signal(signal.SIGKILL)  # the crash
        holder.wait()
    assert uids.claim().uid == FIRST


@contextlib.contextmanager
def holding(claims: Path) -> Iterator[subprocess.Popen]:
    """Another process holding the claim of FIRST, until it is killed."""
    program = ("import pathlib, sys; from services.worker.job_uids import JobUids; "
               f"c = JobUids(pathlib.Path({str(claims)!r}), {FIRST}, 1, in_use=lambda: ()).claim(); "
               "print(c.uid, flush=True); sys.stdin.read()")
    with subprocess.Popen([sys.executable, "-c", program], stdin=subprocess.PIPE, stdout=subprocess.PIPE) as holder:
        assert holder.stdout is not None
        assert int(holder.stdout.readline()) == FIRST
        yield holder

def test_a_uid_that_processes_still_use_is_skipped(tmp_path: Path) -> None:
    running = {FIRST}
    uids = JobUids(tmp_path / "claims", FIRST, 2, in_use=lambda: running)
    assert uids.claim().uid == FIRST + 1
    with pytest.raises(NoFreeUid):
        uids.claim()
    running.clear()  # its last process ended
    assert uids.claim().uid == FIRST


@pytest.mark.skipif(os.geteuid() != 0, reason="starting a process as another user needs root")
def test_a_leftover_process_of_a_dead_claim_keeps_its_uid_taken(tmp_path: Path) -> None:
    """The claim's holder died, but a process with the uid lives on: the uid stays taken until it ends."""
    leftover = subprocess.Popen(["sleep", "30"], user=FIRST, group=FIRST, extra_groups=[])
    try:
        assert FIRST in uids_in_use()
        uids = JobUids(tmp_path / "claims", FIRST, 1)  # the real look at /proc
        with pytest.raises(NoFreeUid):
            uids.claim()
    finally:
        leftover.kill()
        leftover.wait()
    assert uids.claim().uid == FIRST


def test_a_uid_let_go_clean_is_claimed_without_a_look_and_any_other_with_one(tmp_path: Path) -> None:
    """Released clean (its cgroup was removed: no process of it is left), the next claim skips the look at
    the host's processes; released otherwise, or held by a holder that died, the next claim looks."""
    looks: list[int] = []

    def in_use() -> set[int]:
        looks.append(1)
        return set()

    uids = JobUids(tmp_path / "claims", FIRST, 1, in_use=in_use)
    uids.claim().release()
    assert len(looks) == 1  # a new uid: looked
    uids.claim().release(clean=True)
    assert len(looks) == 2  # the last holder had not said clean
    claim = uids.claim()
    assert len(looks) == 2  # clean: no look
    assert (tmp_path / "claims" / str(FIRST)).read_bytes() == b"held"  # a crash now leaves it dirty
    claim.release()
    uids.claim().release()
    assert len(looks) == 3  # released without the word: looked again


def test_a_uid_let_go_clean_is_claimed_again_first_and_others_spread(tmp_path: Path) -> None:
    """The OCI runtime's uids, let go clean, are reused at once (no look, no new claim file); a uid let go
    otherwise goes back to the spread over the range."""
    uids = JobUids(tmp_path / "claims", FIRST, 1000, in_use=lambda: ())
    a, b = uids.claim(), uids.claim()
    a.release(clean=True)
    b.release(clean=True)
    assert uids.claim().uid == b.uid  # the latest first
    assert uids.claim().uid == a.uid
    dirty = uids.claim()
    dirty.release()
    assert [uids.claim().uid for _ in range(3)].count(dirty.uid) <= 1  # spread: rarely the same again


def test_a_clean_mark_does_not_survive_a_holder_that_died(tmp_path: Path) -> None:
    """A claim marks its file held as it takes it: a holder killed after a clean claim leaves it dirty."""
    claims = tmp_path / "claims"
    uids = JobUids(claims, FIRST, 1, in_use=lambda: ())
    uids.claim().release(clean=True)
    with holding(claims) as holder:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    looked = []
    with pytest.raises(NoFreeUid):  # a process of the uid lives on: the look sees it
        JobUids(claims, FIRST, 1, in_use=lambda: looked.append(1) or {FIRST}).claim()
    assert looked == [1]


def test_uids_in_use_sees_this_process() -> None:
    assert os.getuid() in uids_in_use()


def test_a_range_must_be_of_unprivileged_uids(tmp_path: Path) -> None:
    for first, count in [(0, 10), (FIRST, 0), (2**32 - 5, 10)]:
        with pytest.raises(ValueError, match="not a range of unprivileged uids"):
            JobUids(tmp_path, first, count)


def locked_claim_files(claims: Path) -> int:
    """How many claim files someone holds the lock of."""
    held = 0
    for path in claims.iterdir():
        with open(path, "rb") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                held += 1
    return held


def test_claims_made_together_share_a_look_begun_after_their_locks(tmp_path: Path) -> None:
    """A look at the processes serves every claim that took its lock before the look began: claims made
    while a look runs share the next one, never the one that was already running."""
    looks: list[int] = []
    first_look_may_end = threading.Event()

    def in_use() -> set[int]:
        looks.append(len(looks))
        if len(looks) == 1:
            first_look_may_end.wait(10)
        return set()

    claims = tmp_path / "claims"
    uids = JobUids(claims, FIRST, 10, in_use=in_use)
    with ThreadPoolExecutor(5) as pool:
        first = pool.submit(uids.claim)
        others = []
        try:
            deadline = time.monotonic() + 10
            while not looks:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            others = [pool.submit(uids.claim) for _ in range(4)]
            while locked_claim_files(claims) < 5:  # each of the four holds its lock and waits for a look
                assert time.monotonic() < deadline
                time.sleep(0.01)
            assert len(looks) == 1
        finally:
            first_look_may_end.set()
        held = [f.result() for f in (first, *others)]
    assert len({claim.uid for claim in held}) == 5
    assert len(looks) == 2  # the first claim's, then one for the four (begun after their locks)
