"""The keeper of one container: the parent of its first process, from start
to exit, and the one that kills it if the worker dies. Standard library
only: the worker runs it by its path as

    python -I -S keeper.py WORKER_PID RUNC STATE_DIR CONTAINER_ID RUNC_LOG BUNDLE PID_FILE

with its stdin /dev/null and its stdout and stderr the attempt's log pipe.

Why a keeper. `runc run` in the foreground would be the container's parent
and report its exit status, but it copies the job's stdout and stderr
through two pipes of its own, so their lines interleave out of order (an
error message split between two writes came out with another line in its
middle). Detached (`runc run --detach`), runc hands the job the log pipe
itself as both, in order, and exits once the job runs; the job's first
process then needs a parent that waits for it: this keeper, a child
subreaper (PR_SET_CHILD_SUBREAPER), to which the kernel reparents it when
runc exits. The keeper exits with the job's status (128 + the signal when a
signal killed it); with runc's own if the container never started (runc
then wrote its error to its log, and no pid file).

It dies with the worker's thread that started it (PR_SET_PDEATHSIG, as
SIGTERM): it then kills the container (`runc kill --all … KILL`, again
once runc has created it, if it was still at it) and goes on waiting. What
even a keeper cannot cover (it was killed too, the host rebooted) is
cleaned up by the next worker to start on the host (owner.py).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
LOST = 255
"""Exit code when the job's process could not be waited for (it was not reparented here)."""


def main(worker_pid: int, runc: str, state_dir: str, container_id: str, runc_log: str, bundle: str,
         pid_file: str) -> int:
    # runc makes the mount points the image lacks (/dev, /run/secrets/..., ...) with this umask: the worker's
    # 077 would make them directories the job cannot enter.
    os.umask(0o022)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    dying = False

    def kill_container() -> None:
        os.posix_spawn(runc, [runc, "--root", state_dir, "kill", "--all", container_id, "KILL"], {},
                       file_actions=[(os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                                     (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0)])

    def worker_died(signum: int, frame: object) -> None:
        nonlocal dying
        dying = True
        kill_container()  # reaped below, as any child

    signal.signal(signal.SIGTERM, worker_died)
    for option, value in ((PR_SET_CHILD_SUBREAPER, 1), (PR_SET_PDEATHSIG, signal.SIGTERM)):
        if libc.prctl(option, value, 0, 0, 0) != 0:
            return LOST
    if os.getppid() != worker_pid:
        return LOST  # the worker died before we could ask to be told
    starter = os.posix_spawn(runc, [runc, "--root", state_dir, "--log", runc_log, "--log-format", "json", "run",
                                    "--detach", "--bundle", bundle, "--pid-file", pid_file, container_id],
                             {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    job: int | None = None
    ended: dict[int, int] = {}  # exit codes of the children reaped so far (the job's may come before runc's)
    while job is None or job not in ended:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return LOST
        code = os.waitstatus_to_exitcode(status)
        ended[pid] = 128 - code if code < 0 else code
        if pid == starter:
            try:
                with open(pid_file) as f:
                    job = int(f.read().strip())
            except (OSError, ValueError):
                return ended[pid]  # it never started: runc's status
            if dying:
                kill_container()
    return ended[job]


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), *sys.argv[2:8]))
