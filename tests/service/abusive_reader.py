"""An abusive tenant, as a process of its own: THREADS threads, each with its own channel, loop a
ListJobs with the heaviest legal query on one batch as fast as the frontend answers, never waiting
after a refusal (no honest client would, but an abuser does), until the file STOP exists.

    python -m tests.service.abusive_reader ADDRESS CA_CERT TOKEN_FILE BATCH_ID THREADS STOP OUT

It writes to OUT, as JSON, how many calls ended with each status code and how many refusals
(RESOURCE_EXHAUSTED) carried a google.rpc.RetryInfo, and the first message of each code.
A process of its own so that its threads take no CPU time (GIL) from whoever measures the
other tenant's latency (tests/service/test_tenant_abuse.py).
"""

from __future__ import annotations

import collections
import json
import sys
import threading
from pathlib import Path

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from corral.batch.v1 import job_service_pb2 as jpb
from corral.batch.v1 import job_service_pb2_grpc

CALL_TIMEOUT_S = 30.0


def heaviest_query(max_terms: int = 32) -> str:
    """`max_terms` terms of which every job matches all but the last: each row costs every subquery
    of the statement and no row is returned, so a page scans the whole batch."""
    return " ".join(["sample"] * (max_terms - 1) + ["nowhere"])


def main(address: str, ca_cert: str, token_file: str, batch_id: str, threads: str, stop: str, out: str) -> None:
    token = Path(token_file).read_text().strip()
    stop_file = Path(stop)
    counts: collections.Counter[str] = collections.Counter()
    messages: dict[str, str] = {}
    lock = threading.Lock()
    credentials = grpc.ssl_channel_credentials(root_certificates=Path(ca_cert).read_bytes())
    request = jpb.ListJobsRequest(batch_id=int(batch_id), query=heaviest_query(), page_size=100)
    metadata = (("authorization", f"Bearer {token}"),)

    def loop() -> None:
        with grpc.secure_channel(address, credentials) as channel:
            jobs = job_service_pb2_grpc.JobServiceStub(channel)
            while not stop_file.exists():
                code, retry_info = "OK", False
                try:
                    jobs.ListJobs(request, metadata=metadata, timeout=CALL_TIMEOUT_S)
                except grpc.RpcError as e:
                    code = e.code().name  # type: ignore[attr-defined]
                    status = rpc_status.from_call(e)  # type: ignore[arg-type]
                    retry_info = status is not None and any(
                        d.Is(error_details_pb2.RetryInfo.DESCRIPTOR) for d in status.details)
                    with lock:
                        messages.setdefault(code, e.details() or "")  # type: ignore[attr-defined]
                with lock:
                    counts[code] += 1
                    counts[f"{code}+RetryInfo"] += retry_info

    workers = [threading.Thread(target=loop) for _ in range(int(threads))]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    Path(out).write_text(json.dumps({"counts": dict(counts), "messages": messages}))


if __name__ == "__main__":
    main(*sys.argv[1:])
