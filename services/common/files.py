"""Files that other processes read while this one may be writing them."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


def write_atomically(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write `path` whole or not at all, with exactly `mode`: a temporary file
    beside it, renamed into place, so a reader never sees it empty or half
    written."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    os.fchmod(fd, mode)  # exactly `mode`, whatever the umask (services run with 077)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(partial, path)


def try_lock(path: Path, create: bool = True) -> int | None:
    """An exclusive flock on `path` (made 0600 if missing, never through a link), held by the returned
    descriptor until it is closed; None if another process holds it. A process that dies lets it go.
    `create=False`: None too if there is no such file (one being made or removed by its holder)."""
    try:
        fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0) | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileNotFoundError:
        if create:
            raise
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd
