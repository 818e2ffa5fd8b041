"""`corral up` in the foreground: start everything (services.up.app), print where corral is, how the
CLI was set up and where the admin token is (never the token), supervise until asked to stop (Ctrl-C,
SIGTERM, SIGHUP) or until a part cannot be kept running, then stop everything; the exit code says which."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

from corral.cli_config import ADMIN_PROFILE
from services.up.app import STOP_SIGNALS, defer_stop_signals, start
from services.up.config import UpConfig
from services.up.metrics import TARGETS_FILE, write_metrics_targets
from services.worker.oci.runtime import host_refusals as oci_host_refusals

EXIT_STOPPED = 0
"""Stopped because it was asked to (Ctrl-C, SIGTERM, SIGHUP)."""
EXIT_FAILED = 1
"""Stopped because a part could not be kept running, or it could not start."""
EXIT_INTERRUPTED = 130
"""Asked to stop while still starting."""


def jobs_runtime_line(worker_runtime: str) -> str:
    """Where the local workers' jobs run, in one line of `corral up`'s output."""
    if worker_runtime == "process":
        return "Jobs run in the process runtime (--worker-runtime process): as users of their own, not in containers."
    if why_not := oci_host_refusals():
        return f"Jobs run in the process runtime, not in containers: {'; '.join(why_not)}."
    return ("Jobs run in OCI containers (crun, or runc where crun cannot run) of their images, pulled from the "
            "registry their names say "
            "(Docker Hub's from corral's registry first, its mirror).")


def admin_token_line(cli_config_path: Path) -> str:
    """Where the administrator's token is, in one line of `corral up`'s output. Never the token itself, on a
    terminal or not: whatever keeps the output (a log file, the journal, nohup.out, a terminal's scrollback or
    recording) would keep a credential that needs no password, while the CLI already reads it from the
    profile, and `corral profile env` prints it for other tools."""
    return (f"  admin token: in {cli_config_path}, profile '{ADMIN_PROFILE}' (the CLI uses it; "
            f"`corral profile env {ADMIN_PROFILE}` prints it)")


def serve_forever(config: UpConfig) -> int:
    """Start, print the endpoints, supervise until asked to stop or a part cannot be kept running, stop
    everything; the exit code says which (EXIT_*)."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # while starting: `start` stops what it started

    for sig in STOP_SIGNALS:
        signal.signal(sig, interrupt)
    try:
        running = start(config)
    except KeyboardInterrupt:
        print("corral up was interrupted while starting; what it had started is stopped.", file=sys.stderr)
        return EXIT_INTERRUPTED
    requests: list[int] = []
    defer_stop_signals(requests)
    print("corral is up.")
    if running.gateway is not None:
        print(f"corral's address: {running.gateway} (the public gateway: gRPC, and REST at "
              f"https://{running.gateway}/api/v1/..., TLS verified with {running.endpoints['ca_cert']})")
    if "web" in running.endpoints:
        print(f"The web UI: {running.endpoints['web']} (open it in a browser and sign in with a corral user's name "
              f"and password; the browser must trust {running.endpoints['ca_cert']})")
    print(jobs_runtime_line(config.worker_runtime))
    for name, value in running.endpoints.items():
        print(f"  {name:<9} {value}")
    assert running.cli_config_path is not None  # written by `start`
    print(admin_token_line(running.cli_config_path))
    if running.cli_profile == ADMIN_PROFILE:
        print(f"The CLI is configured as the administrator (profile '{ADMIN_PROFILE}', billing project 'default'); "
              "Ctrl-C stops everything.", flush=True)
    else:
        print(f"The CLI is configured: profile '{ADMIN_PROFILE}' is the administrator (billing project 'default'), "
              f"'{running.cli_profile}' stays current (`corral profile use {ADMIN_PROFILE}` switches); "
              "Ctrl-C stops everything.", flush=True)
    if running.metrics_dir is not None:
        targets = json.loads((running.metrics_dir / TARGETS_FILE).read_text())
        print("Prometheus metrics: " + ", ".join(f"{t['labels']['part']} https://{t['targets'][0]}"
                                                  f"{t['labels'].get('__metrics_path__', '/metrics')}"
                                                  for t in targets) +
              f"; workers' too, as they come and go, in {running.endpoints['metrics']} (file_sd); "
              f"each asks for the client certificate in {running.endpoints['metrics_certs']}", flush=True)
    supervisor = running.supervisor
    while not requests and supervisor.failed is None:
        supervisor.check()
        if running.metrics_dir is not None:
            write_metrics_targets(running.metrics_dir)
        time.sleep(0.2)
    if requests:
        supervisor.say(f"{signal.Signals(requests[0]).name}: stopping everything")
    running.stop()
    if supervisor.failed is not None:
        print(f"corral stopped: {supervisor.failed}.", file=sys.stderr, flush=True)
        return EXIT_FAILED
    print("corral stopped.", flush=True)
    return EXIT_STOPPED
