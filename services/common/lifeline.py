"""`corral up`'s lifeline: how a process that is not its child learns that `corral up` is gone.

A local worker is started by a driver, and a driver may be killed and
restarted while its workers keep serving the new leader; so a worker cannot
die with its parent. It dies with `corral up` instead: `corral up` makes a
pipe and keeps the write end for its whole life, writing nothing. The read
end is handed down to every driver it starts, and by the drivers' local
provider to every worker (its number in $CORRAL_LIFELINE_FD; `pass_fds`, as
every other descriptor is closed in a child). When `corral up` ends, however
it ends, SIGKILL included, the kernel closes the write end and the read end
reads end-of-file: the worker shuts down (`watch`).

Only `corral up` holds the write end (os.pipe makes it non-inheritable, and
no child is given it), so end-of-file means exactly that it is gone.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Callable

LIFELINE_VARIABLE = "CORRAL_LIFELINE_FD"
"""The environment variable naming the read end's descriptor number in a process that has one."""


class Lifeline:
    """The pipe, as its holder (`corral up`) sees it."""

    def __init__(self) -> None:
        self.read_fd, self._write_fd = os.pipe()

    def environment(self) -> dict[str, str]:
        """What a child's environment needs to find the read end (pass `read_fd` in its `pass_fds`)."""
        return {LIFELINE_VARIABLE: str(self.read_fd)}

    def close(self) -> None:
        """Cut it: whoever watches the read end sees end-of-file."""
        for fd in (self._write_fd, self.read_fd):
            try:
                os.close(fd)
            except OSError:
                pass


def inherited() -> int | None:
    """The read end this process was given, or None (not started under `corral up`)."""
    value = os.environ.get(LIFELINE_VARIABLE, "")
    if not value.isdigit():
        return None
    try:
        is_pipe = stat.S_ISFIFO(os.fstat(int(value)).st_mode)
    except OSError:
        return None
    return int(value) if is_pipe else None  # a variable inherited without its pipe names some other file


def pass_on() -> tuple[int, ...]:
    """The descriptors to keep open in a child (`pass_fds`) so that it can watch the lifeline too."""
    fd = inherited()
    return () if fd is None else (fd,)


def watch(on_lost: Callable[[], None]) -> bool:
    """Call `on_lost` (in the running event loop) once the lifeline this process was given is cut; False
    if it was given none."""
    fd = inherited()
    if fd is None:
        return False
    loop = asyncio.get_running_loop()

    def readable() -> None:
        if os.read(fd, 1):
            return  # nobody writes to it; if somebody did, it is still alive
        loop.remove_reader(fd)
        on_lost()

    loop.add_reader(fd, readable)
    return True
