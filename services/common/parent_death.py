"""Run a program that dies with the process that started it, even one we cannot change (mariadbd).

    python -I -S parent_death.py PARENT_PID -- PROGRAM [ARGS...]

asks the kernel to SIGKILL this process when its parent dies
(PR_SET_PDEATHSIG), checks that the parent is still PARENT_PID (it may have
died between the fork and the request: then there is nobody to die with, and
it exits 1 at once), and execs PROGRAM in its place: same pid, same open
files, same environment. The request survives exec, so the program dies with
its parent however the parent ends, SIGKILL included.

`corral up` starts every process of its own through this (`launcher()`), from
its main thread: the kernel sends the signal when the *thread* that forked
the child ends, so a process started from a thread that later exits would
be killed then. No Python code of the parent runs between fork and exec (the
request is made here, after exec), so a multithreaded parent is not a
problem either.

Standard library only, run by its path with `-I -S` (like the worker's
jobinit.py): it starts in a few milliseconds and no site or environment
setting changes what it does.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def launcher(parent_pid: int | None = None) -> list[str]:
    """The argv prefix that makes a program die with `parent_pid` (default: this process)."""
    return [sys.executable, "-I", "-S", os.path.abspath(__file__),
            str(os.getpid() if parent_pid is None else parent_pid), "--"]


def die_with_parent(parent_pid: int) -> bool:
    """Ask for SIGKILL when the parent dies; False if the parent is already not `parent_pid`."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        number = ctypes.get_errno()
        raise OSError(number, f"prctl(PR_SET_PDEATHSIG): {os.strerror(number)}")
    return os.getppid() == parent_pid


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--" or not argv[0].isdigit():
        print("usage: parent_death.py PARENT_PID -- PROGRAM [ARGS...]", file=sys.stderr)
        return 2
    if not die_with_parent(int(argv[0])):
        return 1  # the parent died before we could ask to die with it
    os.execvp(argv[2], argv[2:])
    return 127  # not reached: execvp raises if it cannot run the program


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
