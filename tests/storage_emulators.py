"""Object stores on loopback for tests: `gcp-storage-emulator` (GCS's JSON
API, from PyPI) and Azurite (Azure Blob Storage, from npm; scripts/setup.sh --for test
installs it in .tools/azurite). Each runs in a temporary directory of its own,
on a free port of 127.0.0.1, dies with the test process (PR_SET_PDEATHSIG, by
services.common.parent_death) and is stopped by its pid."""

from __future__ import annotations

import contextlib
import dataclasses
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

from services.common.parent_death import launcher
from services.up.ports import free_port

REPO_DIR = Path(__file__).resolve().parents[1]
AZURITE_BLOB = REPO_DIR / ".tools" / "azurite" / "node_modules" / ".bin" / "azurite-blob"

AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
"""Azurite's well-known development account and key (public: in Azurite's documentation)."""


@dataclasses.dataclass
class Emulator:
    """A running emulator."""

    process: subprocess.Popen[bytes]
    endpoint: str
    """http://127.0.0.1:PORT (GCS), http://127.0.0.1:PORT/devstoreaccount1 (Azurite)."""
    log: Path

    @property
    def connection_string(self) -> str:
        """Azurite's: its development account at this endpoint."""
        return (f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
                f"BlobEndpoint={self.endpoint};")

    def stop(self) -> None:
        """SIGTERM by its pid, SIGKILL if it lingers."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _start(argv: list[str], work: Path, ready: Callable[[str], bool], timeout_s: float = 30.0) -> Emulator:
    """Start `argv` in `work`, logging there, until `ready(log)` is true; stop it and raise if it exits or
    `timeout_s` passes first."""
    log = work / "emulator.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([*launcher(), *argv], cwd=work, stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL)
    emulator = Emulator(process, "", log)
    deadline = time.monotonic() + timeout_s
    while not ready(log.read_text(errors="replace")):
        if process.poll() is not None or time.monotonic() > deadline:
            emulator.stop()
            raise RuntimeError(f"{argv[0]} did not start:\n{log.read_text(errors='replace')}")
        time.sleep(0.05)
    return emulator


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2).close()
    except urllib.error.HTTPError:
        return True  # it answered
    except OSError:
        return False
    return True


def start_gcs(work: Path) -> Emulator:
    """gcp-storage-emulator, in memory. It cannot say which port it took when given 0, so it gets a free one
    below the ephemeral range, as `corral up` gives its services."""
    work.mkdir(parents=True, exist_ok=True)
    endpoint = f"http://127.0.0.1:{free_port()}"
    argv = [str(Path(sys.executable).with_name("gcp-storage-emulator")), "start", "--host", "127.0.0.1",
            "--port", endpoint.rsplit(":", 1)[1], "--in-memory"]
    emulator = _start(argv, work, lambda log: _answers(f"{endpoint}/storage/v1/b"))
    emulator.endpoint = endpoint
    return emulator


def start_azurite(work: Path) -> Emulator:
    """Azurite's blob service on port 0 (it prints the port it took), without telemetry."""
    if not AZURITE_BLOB.exists():
        raise RuntimeError(f"{AZURITE_BLOB} is missing: run scripts/setup.sh --for test")
    work.mkdir(parents=True, exist_ok=True)
    (work / "data").mkdir(exist_ok=True)
    listening = "successfully listens on "
    emulator = _start([str(AZURITE_BLOB), "--blobHost", "127.0.0.1", "--blobPort", "0",
                       "--location", str(work / "data"), "--skipApiVersionCheck", "--disableTelemetry", "--silent"],
                      work, lambda log: listening in log)
    base = emulator.log.read_text().split(listening, 1)[1].split()[0].rstrip("/")
    emulator.endpoint = f"{base}/{AZURITE_ACCOUNT}"
    return emulator


@contextlib.contextmanager
def running(emulator: Emulator) -> Iterator[Emulator]:
    """Yield the emulator; stop it afterwards."""
    try:
        yield emulator
    finally:
        emulator.stop()
