"""A worker's scratch disk running out of space, told as an attempt's status.

A job that fills the disk its working directory is on fails for a reason
that is the system's (the disk is shared with the worker and the other
attempts), and a worker that cannot write an attempt's directory or log
fails around it: both end the attempt as Error, and the message names the
disk, so that a user is not told their command failed and an operator
knows which disk to look at.

The disk may have room again by the time the attempt ends (another
attempt's files were removed meanwhile), so a failed command counts as out
of space when the disk is full at its end or when its last output reports
ENOSPC or EDQUOT, as programs print them (strerror's words).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

FULL_BELOW_BYTES = 16 * 2**20
"""A disk is full when less than this is free (or less than 1% of it, on a disk under 1.6 GiB)."""

REPORTS = (b"no space left on device", b"disk quota exceeded")
"""How programs say ENOSPC and EDQUOT (strerror)."""


def free_bytes(path: Path) -> int:
    """What the filesystem holding `path` (or its nearest existing ancestor) has free for an unprivileged
    user; 0 if it cannot be read."""
    stats = _statvfs(path)
    return 0 if stats is None else stats.f_bavail * stats.f_frsize


def is_full(path: Path) -> bool:
    """Whether the filesystem holding `path` (or its nearest existing ancestor) is full."""
    stats = _statvfs(path)
    if stats is None:
        return False
    total, free = stats.f_blocks * stats.f_frsize, stats.f_bavail * stats.f_frsize
    return free < min(FULL_BELOW_BYTES, total // 100)


def ran_out(path: Path) -> str:
    """'the worker's scratch disk ran out of space (MOUNT: FREE of TOTAL bytes free now)'."""
    stats = _statvfs(path)
    if stats is None:
        return "the worker's scratch disk ran out of space"
    total, free = stats.f_blocks * stats.f_frsize, stats.f_bavail * stats.f_frsize
    return f"the worker's scratch disk ran out of space ({_mount_point(path)}: {free:,} of {total:,} bytes free now)"


def out_of_space(error: BaseException) -> bool:
    """Whether `error`, or one it was raised from, is ENOSPC or EDQUOT."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def reports_out_of_space(output_tail: bytes) -> bool:
    """Whether a command's last output says ENOSPC or EDQUOT."""
    tail = output_tail.lower()
    return any(words in tail for words in REPORTS)


def used_bytes(tops: list[Path], owner_uid: int | None = None) -> int:
    """The disk space the files and directories under `tops` take (their allocated blocks, each inode once:
    hard links count once, sparse files only what they hold), not following links or leaving their
    filesystem; only those `owner_uid` owns if given. What vanishes during the walk is not counted. Blocking:
    the walk's time grows with the number of files (host_limits.next_check_delay_s keeps its share down)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for top in tops:
        try:
            device = os.lstat(top).st_dev
        except OSError:
            continue
        stack = [str(top)]
        while stack:  # a stack, not recursion: a job may nest directories deeper than Python recurses
            directory = stack.pop()
            try:
                entries = os.scandir(directory)
            except OSError:
                continue
            with entries:
                for entry in entries:
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if st.st_dev != device:
                        continue  # a mount below (a secret's tmpfs): not the scratch disk
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(entry.path)
                    elif st.st_nlink > 1:  # only a file with other links can be met again
                        if (st.st_dev, st.st_ino) in seen:
                            continue
                        seen.add((st.st_dev, st.st_ino))
                    if owner_uid is None or st.st_uid == owner_uid:
                        total += st.st_blocks * 512
    return total


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _statvfs(path: Path) -> os.statvfs_result | None:
    try:
        return os.statvfs(_existing(path))
    except OSError:
        return None


def _mount_point(path: Path) -> Path:
    path = _existing(path).resolve()
    while not os.path.ismount(path) and path != path.parent:
        path = path.parent
    return path
