"""The keeper of a worker's containers: one long-lived, single-threaded root
process per OCI runtime that starts every attempt's container runtime
(crun or runc) and is the parent of its containers from start to exit, so
that no attempt pays for a Python interpreter of its own and the worker, a
multithreaded gRPC process, never forks for one. Standard library only: the
worker runs it by its path as

    python -I -S keeper.py WORKER_PID

its standard input a Unix SOCK_SEQPACKET socket, the worker's end of which
is the only way to it (an anonymous socketpair). One request per attempt:

    worker -> keeper   JSON {"n": N, "argv": [...], "detached": bool,
                       "pid_file": P, "kill": [...]}, with two descriptors
                       (SCM_RIGHTS): the attempt's output pipe (the
                       runtime's stdout and stderr, so the job's) and its
                       status pipe
    keeper -> worker   b"N started PID" with a pidfd of the runtime's
                       process, or b"N error MESSAGE"

and once the job ended, the keeper writes its exit status (128 + the
signal when a signal killed it; the runtime's own if the container never
started) to the status pipe as a line, and closes it.

Two ways of running a container. crun's `run` in the foreground passes its
own stdout and stderr to the job as they are, waits for it and exits with
its status, deleting the container: the keeper waits for crun. runc's
foreground `run` copies the job's output through two pipes of its own, so
their lines interleave out of order; detached (`run --detach`), it hands
the job the pipe itself and exits once the job runs. The job's first
process then needs a parent that waits for it: the keeper, a child
subreaper (PR_SET_CHILD_SUBREAPER), to which the kernel reparents it when
runc exits (the pid file names it).

The keeper dies with the worker's thread that started it (PR_SET_PDEATHSIG,
as SIGTERM): it then kills every container it keeps with the request's
`kill` command (`RUNTIME kill --all ID KILL`), again for those whose
runtime was still creating them, and exits once all have ended. What even
the keeper cannot cover (it was killed too, the host rebooted) is cleaned
up by the next worker to start on the host (owner.py). It exits when the
worker closes its socket and no container is left.
"""

from __future__ import annotations

import array
import ctypes
import json
import os
import select
import signal
import socket
import sys

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
MAX_REQUEST_BYTES = 16384
FDS_PER_REQUEST = 2
PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
LOST = 255
"""The status when the job's process could not be waited for (it was not reparented here)."""
REMEMBERED_EXITS = 1024
"""Exits of processes no attempt named yet (a detached job may end before its runc is reaped) kept at most."""


class _Attempt:
    def __init__(self, request: dict, status_fd: int):
        self.detached = bool(request["detached"])
        self.pid_file = str(request["pid_file"])
        self.kill = [str(word) for word in request["kill"]]
        self.status_fd = status_fd
        self.job: int | None = None  # a detached container's first process, once its runc exited


class Keeper:
    def __init__(self, requests: socket.socket):
        self.requests = requests
        self.starting: dict[int, _Attempt] = {}  # the runtime's pid -> its attempt
        self.jobs: dict[int, _Attempt] = {}  # a detached job's pid -> its attempt
        self.ended: dict[int, int] = {}  # exit statuses of processes no attempt named (yet)
        self.dying = False
        self.open = True  # the worker's socket

    def serve(self) -> int:
        wakeup_read, wakeup_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wakeup_write)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # wakes the poll (set_wakeup_fd)
        signal.signal(signal.SIGTERM, self._worker_died)
        poller = select.poll()
        poller.register(self.requests, select.POLLIN)
        poller.register(wakeup_read, select.POLLIN)
        while self.open or self.starting or self.jobs:
            for fd, _ in poller.poll():
                if fd == wakeup_read:
                    while _drain(wakeup_read):
                        pass
                elif not self._serve_one():
                    self.open = False
                    poller.unregister(self.requests)
            self._reap()
        return 0

    def _serve_one(self) -> bool:
        """Answer one request; False once the worker closed its end."""
        try:
            message, ancillary, flags, _ = self.requests.recvmsg(
                MAX_REQUEST_BYTES, socket.CMSG_SPACE(4 * FDS_PER_REQUEST), socket.MSG_CMSG_CLOEXEC)
        except OSError:
            return False
        fds = array.array("i")
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
        if not message and not fds:
            return False
        number = "?"
        try:
            if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or len(fds) != FDS_PER_REQUEST:
                raise ValueError(f"a malformed request ({len(message)} bytes, {len(fds)} descriptors)")
            request = json.loads(message)
            number = str(int(request["n"]))
            output_fd, status_fd = fds
            attempt = _Attempt(request, os.dup(status_fd))
            try:
                pid = os.posix_spawn(
                    request["argv"][0], [str(word) for word in request["argv"]], {"PATH": PATH},
                    file_actions=[(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                                  (os.POSIX_SPAWN_DUP2, output_fd, 1), (os.POSIX_SPAWN_DUP2, output_fd, 2)],
                    setsid=True)
            except BaseException:
                os.close(attempt.status_fd)
                raise
            self.starting[pid] = attempt
            pidfd = os.pidfd_open(pid)  # our unreaped child: that very process, exited or not
            try:
                _reply(self.requests, f"{number} started {pid}", pidfd)
            finally:
                os.close(pidfd)
            if self.dying:  # asked for while the worker died: it never gets to run
                _spawn_quietly(attempt.kill)
        except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
            _reply(self.requests, f"{number} error {e}")
        finally:
            for fd in fds:
                os.close(fd)
        return True

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            code = os.waitstatus_to_exitcode(status)
            code = 128 - code if code < 0 else code
            if (attempt := self.starting.pop(pid, None)) is not None:
                self._runtime_exited(attempt, code)
            elif (attempt := self.jobs.pop(pid, None)) is not None:
                _finish(attempt, code)
            else:
                self.ended[pid] = code
                while len(self.ended) > REMEMBERED_EXITS:
                    del self.ended[next(iter(self.ended))]

    def _runtime_exited(self, attempt: _Attempt, code: int) -> None:
        if not attempt.detached:
            _finish(attempt, code)  # crun's status is the job's
            return
        try:
            with open(attempt.pid_file) as f:
                job = int(f.read().strip())
        except (OSError, ValueError):
            _finish(attempt, code)  # it never started: runc's status
            return
        if job in self.ended:
            _finish(attempt, self.ended.pop(job))
        elif os.path.exists(f"/proc/{job}"):
            attempt.job = job
            self.jobs[job] = attempt
            if self.dying:
                _spawn_quietly(attempt.kill)
        else:
            _finish(attempt, LOST)  # not ours to wait for

    def _worker_died(self, signum: int, frame: object) -> None:
        self.dying = True
        for attempt in [*self.starting.values(), *self.jobs.values()]:
            _spawn_quietly(attempt.kill)  # reaped as any child


def _finish(attempt: _Attempt, code: int) -> None:
    try:
        os.write(attempt.status_fd, f"{code}\n".encode())
    except OSError:
        pass  # the worker is gone
    os.close(attempt.status_fd)


def _spawn_quietly(argv: list[str]) -> None:
    try:
        os.posix_spawn(argv[0], argv, {"PATH": PATH},
                       file_actions=[(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                                     (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                                     (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0)])
    except OSError:
        pass


def _drain(fd: int) -> bool:
    try:
        return bool(os.read(fd, 512))
    except BlockingIOError:
        return False


def _reply(requests: socket.socket, text: str, fd: int | None = None) -> None:
    ancillary = [] if fd is None else [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))]
    try:
        requests.sendmsg([text.encode("utf-8", "replace")], ancillary)
    except OSError:
        pass  # the worker is gone; its containers are killed (SIGTERM)


def main(worker_pid: int) -> int:
    # The runtime makes the mount points the image lacks (/dev, /run/secrets/..., ...) with this umask: the
    # worker's 077 would make them directories the job cannot enter.
    os.umask(0o022)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    for option, value in ((PR_SET_CHILD_SUBREAPER, 1), (PR_SET_PDEATHSIG, signal.SIGTERM)):
        if libc.prctl(option, value, 0, 0, 0) != 0:
            return LOST
    if os.getppid() != worker_pid:
        return LOST  # the worker died before we could ask to be told
    return Keeper(socket.socket(fileno=0)).serve()


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
