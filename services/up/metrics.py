"""`corral up --metrics`: where Prometheus finds every process's metrics. Each service and worker serves them
on a loopback port of its own (TLS, for a client certificate of the deployment CA) and writes the port to
DATA/metrics/NAME.port; `write_metrics_targets` keeps DATA/metrics/targets.json, in Prometheus' file_sd
format, listing them as workers come and go."""

from __future__ import annotations

import json
from pathlib import Path

from services.common.files import write_atomically

TARGETS_FILE = "targets.json"
METRICS_IDENTITY = "metrics"
"""The scraper's certificate, in DATA/certs/metrics: every metrics port asks for a client certificate of the
CA. It names no service, so no gRPC service accepts it."""
METRICS_PATHS = {"gateway-": "/stats/prometheus"}
"""Where a part whose name starts with the key serves its metrics, if not at /metrics (a gateway's
statistics listener; Prometheus reads the `__metrics_path__` label)."""


def write_metrics_targets(metrics_dir: Path) -> Path:
    """`metrics_dir/targets.json`, in Prometheus' file_sd format: one target per process that wrote its
    metrics port (`NAME.port`), labelled with its part's name, https (`__scheme__`), and the path of its
    metrics where it is not /metrics (METRICS_PATHS); rewritten only when it changes."""
    targets = []
    for port_file in sorted(metrics_dir.glob("*.port")):
        try:
            port = int(port_file.read_text())
        except (OSError, ValueError):
            continue  # gone meanwhile
        labels = {"part": port_file.stem, "__scheme__": "https"}
        labels.update({"__metrics_path__": path for prefix, path in METRICS_PATHS.items()
                       if port_file.stem.startswith(prefix)})
        targets.append({"targets": [f"127.0.0.1:{port}"], "labels": labels})
    path = metrics_dir / TARGETS_FILE
    text = json.dumps(targets, indent=1)
    if not path.exists() or path.read_text() != text:
        write_atomically(path, text.encode())
    return path
