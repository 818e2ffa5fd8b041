"""OpenTelemetry across processes: with `corral up --trace`, one trace follows a
submission from the frontend's RPC, through the driver's NotifyChange, to the
worker's run of each job (its context travels in RunJob)."""

from __future__ import annotations

import json
from pathlib import Path

import corral
from tests.e2e import cluster as up
from tests.e2e.cluster import eventually


def spans(traces_dir: Path) -> list[dict]:
    found = []
    for path in traces_dir.glob("*.jsonl"):
        found += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return found


def test_one_trace_from_submission_to_the_workers_run(tmp_path: Path) -> None:
    cluster = up.start(tmp_path, "--trace", "--idle-timeout", "5")
    try:
        builder = corral.BatchBuilder("default")
        first = builder.job("busybox", ["echo", "one"])
        builder.job("busybox", ["echo", "two"], parents=[first])
        with cluster.client() as client:
            batch = client.submit(builder)
            client.wait(batch.batch_id)
        traces_dir = cluster.data_dir / "traces"

        def submission_trace() -> list[dict] | None:
            [submit] = [s for s in spans(traces_dir) if s["name"] == "/corral.batch.v1.BatchService/SubmitBatch"
                        and s["kind"] == "SpanKind.SERVER"] or [None]
            if submit is None:
                return None
            trace = [s for s in spans(traces_dir) if s["context"]["trace_id"] == submit["context"]["trace_id"]]
            runs = [s for s in trace if s["name"] == "job.run"]
            return trace if len(runs) == 2 else None

        trace = eventually(submission_trace, timeout_s=30, what="the worker's spans of both jobs")
    finally:
        cluster.stop()
    services = {(s["resource"]["attributes"]["service.name"], s["name"]) for s in trace}
    assert ("corral-frontend", "/corral.batch.v1.BatchService/SubmitBatch") in services
    assert ("corral-auth", "/corral.auth.v1.AuthService/VerifyToken") in services
    assert ("corral-driver", "/corral.driver.v1.DriverService/NotifyChange") in services
    runs = [s for s in trace if s["name"] == "job.run"]
    assert {s["resource"]["attributes"]["service.name"] for s in runs} == {"corral-worker"}
    assert sorted(s["attributes"]["corral.job_id"] for s in runs) == [1, 2]
    assert {s["attributes"]["corral.state"] for s in runs} == {"Success"}
