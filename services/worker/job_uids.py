"""User ids for attempts: each running attempt on a host has a uid (and a gid
of the same number) that no other process on the host uses.

Several workers share a host, so a claim must hold across processes: a uid
is claimed by holding an exclusive `flock` on the file named after it in a
directory the host's workers share. The kernel drops the lock when its
holder dies, so a crashed worker leaves no stale claim. A free lock is not
enough, though: the processes of a crashed worker's attempt could outlive
it (they die with it, by design, but a uid is worth a check), so a uid is
also skipped while any process on the host runs with it. Uids are tried
from a random point of the range so that one is rarely reused soon.

That look reads every process's status (milliseconds on a busy host), so
a claim skips it when the uid's file says the last holder let it go
`clean`: it saw the attempt's cgroup removed, so no process of the uid was
left. A claim marks its file `held` first, so a holder that dies or lets
go without that certainty leaves it marked, and the next claim looks. The
range is corral's: no other program may run processes with its uids.

A uid let go clean is also claimed again first, by the same process: only
the OCI runtime says clean, and nothing of a container's attempt outlives
it that its uid could reach (its root filesystem, /tmp, /dev/shm and IPC
namespace go with it), where the process runtime's jobs share the host's
shared directories, which is why its uids are spread over the range.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import random
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path


class NoFreeUid(Exception):
    """Every uid of the range is claimed or still has processes."""


@dataclass
class UidClaim:
    """A uid this process holds until `release`."""

    uid: int
    _fd: int | None
    _on_clean: Callable[[int], None] | None = None

    def release(self, clean: bool = False) -> None:
        """Let other attempts have the uid (idempotent). `clean`: no process of the attempt can be left (its
        cgroup was removed), so the next claim need not look through the host's processes, and nothing of
        the attempt outlives it (the OCI runtime's), so the uid may be claimed again first."""
        if self._fd is not None:
            try:
                if clean:
                    _mark(self._fd, CLEAN)
            finally:
                os.close(self._fd)  # closing drops the flock
                self._fd = None
            if clean and self._on_clean is not None:
                self._on_clean(self.uid)


HELD, CLEAN = b"held", b"clean"
"""What a uid's claim file says: taken (or its holder died) / let go with no process left."""


def _mark(fd: int, word: bytes) -> None:
    os.pwrite(fd, word, 0)
    os.ftruncate(fd, len(word))


def uids_in_use(proc: Path = Path("/proc")) -> set[int]:
    """Every real, effective, saved and filesystem uid of the host's processes (from /proc/PID/status,
    which a process cannot hide the way it can make /proc/PID belong to root). Each file is read in one
    call: the kernel writes all of it anyway, and the Uid line is near its top."""
    uids: set[int] = set()
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        try:
            fd = os.open(os.path.join(entry.path, "status"), os.O_RDONLY | os.O_CLOEXEC)
            try:
                status = os.read(fd, 4096)
            finally:
                os.close(fd)
        except (FileNotFoundError, ProcessLookupError):
            continue  # it exited while we looked
        start = status.find(b"\nUid:")
        if start >= 0:
            uids.update(int(u) for u in status[start + 5:status.find(b"\n", start + 1)].split())
    return uids


class SharedLook:
    """Looks at the host's processes for claims made at once in several threads: a look serves every
    claim whose lock was taken before the look began, so claims that come together share one (it costs
    a read of every /proc/PID/status: milliseconds on a busy host)."""

    def __init__(self, in_use: Callable[[], Iterable[int]]):
        self._in_use = in_use
        self._changed = threading.Condition()
        self._begun = 0  # looks begun so far; the latest one's number
        self._done = 0  # the number of the latest look finished
        self._seen: set[int] = set()  # what it saw

    def since_now(self) -> set[int]:
        """The uids in use, as seen by a look that began after this call did."""
        with self._changed:
            wanted = self._begun + 1  # every look numbered so or higher begins after now
            while self._done < wanted and self._begun > self._done:
                self._changed.wait()  # one look at a time; the current one may be new enough
            if self._done >= wanted:
                return self._seen
            self._begun += 1  # nobody is looking, and no look new enough has been: ours
        try:
            seen = set(self._in_use())
        except BaseException:
            with self._changed:
                self._begun -= 1  # as if it never began: a waiter looks instead
                self._changed.notify_all()
            raise
        with self._changed:
            self._done, self._seen = self._begun, seen
            self._changed.notify_all()
        return seen


class JobUids:
    """Claims uids in [first, first + count) for attempts, across the workers of this host."""

    def __init__(self, claims_dir: Path, first: int, count: int,
                 in_use: Callable[[], Iterable[int]] = uids_in_use):
        if first <= 0 or count <= 0 or first + count > 2**32 - 1:
            raise ValueError(f"uid range [{first}, {first + count}) is not a range of unprivileged uids")
        self.claims_dir = claims_dir
        self.first = first
        self.count = count
        self._look = SharedLook(in_use)
        self._clean: list[int] = []  # let go clean by this process, the latest last
        self._clean_lock = threading.Lock()

    def claim(self) -> UidClaim:
        """A uid no other attempt holds and no process uses; raises NoFreeUid."""
        self.claims_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        dir_fd = os.open(self.claims_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            busy: set[int] = set()  # as of the last look: skipped without taking their locks
            start = random.randrange(self.count)
            with self._clean_lock:
                clean, self._clean = self._clean, []
            spread = (self.first + (start + i) % self.count for i in range(self.count))
            for uid in itertools.chain(reversed(clean), spread):
                if uid in busy:
                    continue
                fd = os.open(str(uid), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                # Look at the processes only now that we hold the lock: no new claim can start any with
                # the uid, so what runs with it now is a leftover (of a dead claim, or of one that ended
                # just before our lock) and keeps it taken. One look per claim at most, as a rule, and
                # none when the last holder let it go clean.
                try:
                    if os.pread(fd, len(CLEAN) + 1, 0) != CLEAN:
                        busy = self._look.since_now()
                        if uid in busy:
                            os.close(fd)
                            continue
                    _mark(fd, HELD)
                except BaseException:
                    os.close(fd)
                    raise
                with self._clean_lock:  # the rest of those let go clean, for the next claims
                    self._clean[:0] = [u for u in clean if u != uid]
                return UidClaim(uid, fd, self._let_go_clean)
        finally:
            os.close(dir_fd)
        with self._clean_lock:
            self._clean[:0] = clean
        raise NoFreeUid(f"all {self.count} job uids from {self.first} are in use on this host "
                        f"(claims in {self.claims_dir})")

    def _let_go_clean(self, uid: int) -> None:
        with self._clean_lock:
            self._clean.append(uid)
