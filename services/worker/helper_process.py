"""A long-lived root helper of the worker's, spoken to over an anonymous
socket pair: the process runtime's job launcher (launcher.py) and the OCI
runtime's keeper (oci/keeper.py) are two. Each is a standard-library
program run by its path with `python -I -S PROGRAM WORKER_PID`, its
standard input the socket (nothing on the filesystem, nothing a job could
connect to); it asks for PR_SET_PDEATHSIG first, so it dies with the
worker's thread that started it (start it from the event loop's), and it
answers each request with one message, descriptors attached.
"""

from __future__ import annotations

import array
import contextlib
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Self

ANSWER_TIMEOUT_S = 10.0
"""How long the worker waits for an answer (the helper answers at once); past it, the helper is killed and the
next request gets a new one."""


class HelperProcess:
    """One helper program, started by `spawn` (each kind's `start` names its program)."""

    def __init__(self, proc: subprocess.Popen, requests: socket.socket):
        self.proc = proc
        self.pid = proc.pid
        self._requests = requests
        self._count = 0
        self._failed = False

    @classmethod
    def spawn(cls, program: Path) -> Self:
        """Raises OSError or subprocess.SubprocessError if it cannot be started."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            # A clean exec, no preexec_fn: its only descriptors are the socket (its stdin), /dev/null and the
            # worker's stderr (for its last words).
            proc = subprocess.Popen([sys.executable, "-I", "-S", str(program), str(os.getpid())], cwd="/", env={},
                                    stdin=theirs, stdout=subprocess.DEVNULL, start_new_session=True)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.settimeout(ANSWER_TIMEOUT_S)
        return cls(proc, ours)

    def ask(self, message: bytes, fds: list[int], answer_fds: int) -> tuple[str, bytes, list[int]]:
        """Send one request with `fds` attached; its number (as the helper's answer starts with it), the answer
        and at most `answer_fds` descriptors that came with it. Raises OSError (a timeout too): the helper is
        then killed."""
        self._count += 1
        try:
            self._requests.sendmsg([message], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
            reply, ancillary, _, _ = self._requests.recvmsg(4096, socket.CMSG_SPACE(4 * answer_fds),
                                                            socket.MSG_CMSG_CLOEXEC)
        except OSError:
            self.kill()
            raise
        return str(self._count), reply, received_fds(ancillary)

    def kill(self) -> None:
        """Kill it."""
        self._failed = True
        self.proc.kill()
        self.proc.wait()

    def close(self) -> None:
        """Let it go: it exits once its socket is closed (each helper says what it does with its work then)."""
        self._requests.close()
        try:
            self.proc.wait(timeout=ANSWER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()

    def __del__(self) -> None:
        # Dropped without `close`: the helper is not left behind (nor Popen's warning about it). At interpreter
        # exit what `close` needs may be gone already; the helper then dies with us.
        if self.proc.returncode is None:
            with contextlib.suppress(Exception):
                self.close()


def received_fds(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    fds = array.array("i")
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    return list(fds)
