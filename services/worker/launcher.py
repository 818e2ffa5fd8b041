"""The worker's job launcher: one long-lived, single-threaded root process per
process runtime that starts the isolated attempts, so that no attempt pays
for a Python interpreter of its own and the worker, a multithreaded gRPC
process, never forks for one.

The worker runs `python -I -S launcher.py WORKER_PID` (this file by its
path: standard library only, no site, no environment), its standard input
a Unix SOCK_SEQPACKET socket, the worker's end of which is the only way to
it (an anonymous socketpair: nothing on the filesystem, nothing a job could
connect to). It asks for PR_SET_PDEATHSIG first and exits if the worker is
already gone, so it dies with the worker; it exits when the worker closes
the socket.

One request per attempt, one message each way:

    worker -> launcher  b"start N", with three descriptors (SCM_RIGHTS): a
                        memfd holding the instructions as JSON (the job's
                        command, environment and isolation: never on a
                        command line), the job's output pipe, its report pipe
    launcher -> worker  b"N started PID" with a pidfd of the attempt's top
                        process (SCM_RIGHTS), or b"N error MESSAGE"

The launcher forks (it has one thread, so forking is safe here), and the
child runs `jobinit.run_attempt`, which isolates the job and reports on the
report pipe as before. The worker watches, signals and awaits the attempt
through its pidfd: no pid can be reused under it. The launcher reaps its
children when their own pidfds say they exited.
"""

from __future__ import annotations

import array
import json
import os
import select
import signal
import socket
import sys

# `python -I` puts no script directory on the path; appended last, so no standard module can be shadowed.
sys.path.append(os.path.dirname(os.path.abspath(__file__)))
import jobinit  # noqa: E402

MAX_REQUEST_BYTES = 64
FDS_PER_REQUEST = 3


def main() -> int:
    """Serve start requests until the worker closes the socket (or dies)."""
    if not jobinit.die_with_parent(int(sys.argv[1])):
        return 1  # the worker died before we could ask to die with it
    requests = socket.socket(fileno=0)
    children: dict[int, int] = {}  # pidfd -> pid, until reaped
    poller = select.poll()
    poller.register(requests, select.POLLIN)
    while True:
        for fd, _ in poller.poll():
            if fd != requests.fileno():
                os.waitpid(children.pop(fd), 0)
                poller.unregister(fd)
                os.close(fd)
                continue
            message, fds = _receive(requests)
            if not message:
                return 0  # the worker closed its end
            number, started = _start(message, fds)
            if isinstance(started, str):
                _reply(requests, f"{number} error could not start the attempt: {started}")
                continue
            pid, pidfd = started
            children[pidfd] = pid
            poller.register(pidfd, select.POLLIN)
            _reply(requests, f"{number} started {pid}", pidfd)


def _receive(requests: socket.socket) -> tuple[bytes, list[int]]:
    """One request and the descriptors that came with it (b"" at the end)."""
    message, ancillary, flags, _ = requests.recvmsg(MAX_REQUEST_BYTES, socket.CMSG_SPACE(4 * FDS_PER_REQUEST),
                                                    socket.MSG_CMSG_CLOEXEC)
    fds = array.array("i")
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        message = b"truncated"
    return message, list(fds)


def _start(message: bytes, fds: list[int]) -> tuple[str, tuple[int, int] | str]:
    """Fork the attempt a request asks for: the request's number, and (pid, pidfd) of the attempt's top
    process, or why it could not start. Closes the request's descriptors (the child has its copies)."""
    word, _, number = message.decode("ascii", "replace").partition(" ")
    try:
        if word != "start" or len(fds) != FDS_PER_REQUEST:
            raise ValueError(f"a malformed request ({message[:20]!r} with {len(fds)} descriptors)")
        instructions_fd, output_fd, status_fd = fds
        with open(instructions_fd, "rb", closefd=False) as f:
            f.seek(0)  # the worker's writes left the shared offset at the end
            spec = json.loads(f.read())
        launcher = os.getpid()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = jobinit.run_attempt(spec, output_fd, status_fd, launcher)
            finally:
                os._exit(code)  # never back into the launcher's loop
        try:
            pidfd = os.pidfd_open(pid)  # our unreaped child: that very process, exited or not
        except OSError:
            os.kill(pid, signal.SIGKILL)  # nobody could watch it
            os.waitpid(pid, 0)
            raise
    except (OSError, ValueError) as e:
        return number, str(e)
    finally:
        for fd in fds:
            os.close(fd)
    return number, (pid, pidfd)


def _reply(requests: socket.socket, text: str, fd: int | None = None) -> None:
    ancillary = [] if fd is None else [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))]
    try:
        requests.sendmsg([text.encode("utf-8", "replace")], ancillary)
    except OSError:
        pass  # the worker is gone; the attempts die with us


if __name__ == "__main__":
    sys.exit(main())
