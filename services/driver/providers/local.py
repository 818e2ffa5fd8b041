"""The local provider: a "machine" is a worker process on this host with a declared number of cores,
created and deleted as a cloud's API creates and deletes a VM."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

from services.common import lifeline
from services.common.processes import PidFiles, Recorded, end_processes
from services.driver.pricing.products import LOCAL, Machine
from services.driver.providers.interface import InstanceRequest

log = logging.getLogger(__name__)


def _worker_environment(activation_token: str) -> dict[str, str]:
    """A local worker's environment: the driver's, less its database URL (a worker never talks to the
    database), plus the worker's one-time activation token."""
    env = {k: v for k, v in os.environ.items() if k != "CORRAL_DATABASE_URL"}
    return {**env, "CORRAL_ACTIVATION_TOKEN": activation_token}


class LocalProvider:
    """Worker processes on this host; `command(request)` builds each one's argv. The activation token goes
    in the worker's environment (CORRAL_ACTIVATION_TOKEN), never on its command line, which every local
    user (and, without isolation, every job) can read.

    Each worker is recorded in `pid_files` as `worker-NAME`, so that any driver can delete a local
    machine by its name, as a cloud's API deletes a VM, including one a driver that has since died
    started (it kept serving: its parent's death is not its own), and so that `corral up` finds every
    worker when it stops. A worker started under `corral up` is handed its lifeline
    (services.common.lifeline): it ends with `corral up`, whichever driver started it."""

    def __init__(self, command: Callable[[InstanceRequest], Sequence[str]], log_dir: Path,
                 forget: Callable[[str], None] = lambda name: None, pid_files: PidFiles | None = None):
        self._command = command
        self._log_dir = log_dir
        self._forget = forget
        """Called with an instance's name once its process is gone (removes what `command` prepared)."""
        self._pid_files = pid_files
        self._processes: dict[str, subprocess.Popen[bytes]] = {}

    def machine(self, request: InstanceRequest) -> Machine:
        return LOCAL

    def machine_kinds(self) -> set[Machine]:
        return {LOCAL}

    async def create(self, request: InstanceRequest) -> None:
        self._log_dir.mkdir(parents=True, exist_ok=True)
        with open(self._log_dir / f"{request.name}.log", "ab") as log_file:
            process = subprocess.Popen(
                list(self._command(request)), stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
                env=_worker_environment(request.activation_token), pass_fds=lifeline.pass_on())
        self._processes[request.name] = process
        if self._pid_files is not None:
            self._pid_files.record(f"worker-{request.name}", process.pid)

    async def delete(self, name: str) -> None:
        process = self._processes.pop(name, None)
        if process is None:
            await self._delete_adopted(name)
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                # In a thread: a worker deactivates itself on SIGTERM, through this driver's own loop.
                await asyncio.to_thread(process.wait, 10)
            except subprocess.TimeoutExpired:
                process.kill()
                await asyncio.to_thread(process.wait)
        self._gone(name)

    async def _delete_adopted(self, name: str) -> None:
        """A worker another driver started (found from its pid file), stopped as that driver would."""
        pid_files = self._pid_files
        record = pid_files.read(f"worker-{name}") if pid_files is not None else None
        if pid_files is None or record is None or not record.alive():
            return
        log.info("stopping %s (pid %d), started by another driver", name, record.pid)
        await asyncio.to_thread(end_processes, [Recorded(record)], 10.0, log.info)
        pid_files.forget(f"worker-{name}")
        self._forget(name)

    def _gone(self, name: str) -> None:
        if self._pid_files is not None:
            self._pid_files.forget(f"worker-{name}")
        self._forget(name)

    async def alive(self) -> set[str]:
        """The workers this provider started that still run, and, with `pid_files`, those another driver
        started that it recorded there (after a failover, the new leader's reconciler must not take a worker
        its predecessor started for a vanished machine)."""
        for name in [n for n, p in self._processes.items() if p.poll() is not None]:
            self._processes.pop(name).wait()
            self._gone(name)
        adopted = set()
        if self._pid_files is not None:
            adopted = {r.name.removeprefix("worker-") for r in self._pid_files.live("worker-")}
        return set(self._processes) | adopted

    async def gone(self, names: Collection[str]) -> set[str]:
        """Those of `names` this data directory's drivers started (each has its log here, opened before its
        process starts) whose process no longer runs: ended, or ended with an earlier `corral up` (its
        workers end with it, and a restarted one ends what is left). A name with no log here was never a
        worker process of these drivers (one being created, or another data directory's): not known."""
        return {name for name in names if (self._log_dir / f"{name}.log").exists() and not self._runs(name)}

    def _runs(self, name: str) -> bool:
        """Whether the worker process of `name` runs now: started here, or recorded by another driver."""
        process = self._processes.get(name)
        if process is not None and process.poll() is None:
            return True
        record = self._pid_files.read(f"worker-{name}") if self._pid_files is not None else None
        return record is not None and record.alive()

    def pid(self, name: str) -> int | None:
        process = self._processes.get(name)
        return process.pid if process else None

    async def close(self) -> None:
        """Stop every worker process this provider started."""
        for name in list(self._processes):
            await self.delete(name)
