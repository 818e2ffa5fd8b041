"""runc, as the OCI runtime drives it: one state directory per worker
(`runc --root`), a container per attempt, started detached under a keeper
(keeper.py: the parent of the job's first process, which reports its exit
status and kills the container if the worker dies), killed and deleted
with runc's own commands.

runc's own words go to a JSON log file of the attempt (`--log`), which
`last_error` reads; when runc fails before the job runs it also prints them
on its stderr, the log pipe, so they reach the job's log too (they are
useful there: `exec: "x": executable file not found in $PATH`). runc writes
the pid file only once the job's process runs, so its presence tells a job
that started from a container that never did.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from pathlib import Path

SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
"""Where the worker finds runc and cp (never the job's PATH)."""
COMMAND_TIMEOUT_S = 30.0
"""How long a runc kill, delete or list may take."""
KEEPER = Path(__file__).with_name("keeper.py")
"""Run by its path with `python -I -S`: it imports nothing of corral."""


class RuncError(Exception):
    """runc failed; the message has its words."""


def find(program: str) -> str | None:
    return shutil.which(program, path=SYSTEM_PATH)


class Runc:
    """runc with one state directory (`--root`)."""

    def __init__(self, binary: str, root: Path):
        self.binary = binary
        self.root = root

    async def run(self, container_id: str, bundle: Path, log: Path, pid_file: Path,
                  output_fd: int) -> asyncio.subprocess.Process:
        """Start the container under its keeper, the job's stdout and stderr both on `output_fd`, its stdin
        /dev/null. The keeper's exit status is the job's (runc's if the job never started). Call it from the
        thread that lives as long as the worker (the event loop's): the keeper is told when that thread
        ends."""
        return await asyncio.create_subprocess_exec(
            sys.executable, "-I", "-S", str(KEEPER), str(os.getpid()), self.binary, str(self.root), container_id,
            str(log), str(bundle), str(pid_file),
            stdin=asyncio.subprocess.DEVNULL, stdout=output_fd, stderr=output_fd, env={}, cwd="/",
            start_new_session=True)

    async def kill(self, container_id: str, signal_name: str) -> None:
        """Send the signal to every process of the container; a container that is gone is no error."""
        await self._call("kill", "--all", container_id, signal_name, missing_ok=True)

    async def delete(self, container_id: str) -> None:
        """Kill what is left of the container and forget it (its cgroup and state)."""
        await self._call("delete", "--force", container_id, missing_ok=True)

    async def list(self) -> list[str]:
        """The containers in the state directory."""
        if not self.root.exists():
            return []
        out = await self._call("list", "--format", "json")
        return [c["id"] for c in json.loads(out or "null") or []]

    async def _call(self, *args: str, missing_ok: bool = False) -> str:
        process = await asyncio.create_subprocess_exec(
            self.binary, "--root", str(self.root), *args, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env={"PATH": SYSTEM_PATH}, cwd="/")
        try:
            async with asyncio.timeout(COMMAND_TIMEOUT_S):
                out, err = await process.communicate()
        except TimeoutError:
            process.kill()
            await process.wait()
            raise RuncError(f"runc {args[0]} took over {COMMAND_TIMEOUT_S:g} s") from None
        words = err.decode(errors="replace").strip()
        if process.returncode != 0:
            if missing_ok and ("does not exist" in words or "not exist" in words):
                return ""
            raise RuncError(f"runc {' '.join(args[:2])}: {words or f'exit code {process.returncode}'}")
        return out.decode(errors="replace")


def last_error(log: Path) -> str:
    """runc's last error in its JSON log, '' if none."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    for line in reversed(lines):
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("level") in ("error", "fatal"):
            return str(entry.get("msg", "")).strip()
    return ""


async def wait_until_running(keeper: asyncio.subprocess.Process, pid_file: Path) -> bool:
    """Wait until the job's process runs (runc wrote its pid file) or the keeper exited (runc could not
    start it); whether it runs."""
    exited = asyncio.ensure_future(keeper.wait())
    try:
        delay = 0.001
        while not pid_file.exists():
            if (await asyncio.wait({exited}, timeout=delay))[0]:
                return pid_file.exists()
            delay = min(2 * delay, 0.005)  # a stat every 5 ms at most: runc takes some 30 ms
        return True
    finally:
        exited.cancel()
