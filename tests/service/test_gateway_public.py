"""The public gateway, live: the real Envoy on its generated config in front of a real auth service and
frontend (TLS from the test CA), and people's clients pointed at the gateway only.

- gRPC: the Python client submits and reads a batch through it;
- REST/JSON with `Authorization: Bearer`: list batches, submit one, read it, list its jobs with their parents
  and attempts; the fleet's pools and instances;
- errors: a gRPC error comes back with the HTTP status of its code and the
  google.rpc.Status (with its details) as the JSON body;
- a server stream (WatchBatch) arrives as JSON, one message per line, while it runs; so does a job's log
  followed (StreamJobLog) from before the job starts to its end;
- server reflection lists the services through the gateway;
- each request leaves a JSON access-log line carrying its x-request-id and traceparent."""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

import corral
from corral.aio import Client
from corral.builder import BatchBuilder
from services.auth.app import AuthApp
from services.common.tls import DevCertificateAuthority
from services.db.database import Database
from services.db.store import JobStore
from services.frontend.app import FrontendApp
from services.gateway.deployment import Limits
from tests.envoy_gateway import gateway_deployment, running
from tests.service.test_buf_curl import buf_curl
from tests.service.test_watch import Driving, driving  # noqa: F401 - a fixture

pytestmark = pytest.mark.timeout(120)

MAX_REQUEST_BYTES = 64 * 1024
"""The gateway's request size limit here: small, so the refused body fits in the socket's buffers and the
client reads the 413 rather than a reset while it still writes."""


@pytest.fixture
async def gateway_port(auth_app: AuthApp, frontend: FrontendApp, certs: DevCertificateAuthority,
                 tmp_path: Path) -> AsyncIterator[int]:
    """The public gateway's port, in front of `auth_app` and `frontend` (the driver is not used)."""
    deployment = gateway_deployment(tmp_path / "gateway", certs, auth_app.public_port, [frontend.public_port],
                                    [auth_app.internal_port], Limits(max_request_bytes=MAX_REQUEST_BYTES,
                                                                     health_check_interval_s=0.2))
    async with running(deployment, tmp_path / "gateway", "public", healthy=("auth", "frontend")) as (_, port):
        yield port


def rest(certs: DevCertificateAuthority, port: int, token: str) -> httpx.AsyncClient:
    """A REST client over HTTPS/1.1, trusting the test CA, with a bearer token."""
    context = ssl.create_default_context(cafile=str(certs.ca_cert_path))
    return httpx.AsyncClient(base_url=f"https://localhost:{port}", verify=context, timeout=30,
                             headers={"authorization": f"Bearer {token}"})


async def test_grpc_and_rest_through_the_gateway(gateway_port: int, frontend: FrontendApp, db: Database,
                                                 certs: DevCertificateAuthority, admin_token: str,
                                                 tmp_path: Path) -> None:
    await JobStore(db).create_billing_project("proj", ["root"])
    address = f"localhost:{gateway_port}"

    # gRPC: the Python client, auth and frontend both at the gateway's one address.
    async with Client(address, admin_token, certs.ca_cert_path, auth_address=address) as client:
        builder = BatchBuilder("proj", attributes={"name": "over-grpc"})
        builder.job("busybox", ["true"])
        batch_id = (await client.submit(builder)).batch_id
        assert (await client.get_batch(batch_id)).attributes["name"] == "over-grpc"

    async with rest(certs, gateway_port, admin_token) as http:
        me = await http.get("/api/v1/auth/whoami")  # routed to auth
        assert me.status_code == 200 and me.headers["content-type"] == "application/json", me.text
        assert "root" in me.text
        regions = await http.get("/api/v1/regions")
        assert regions.status_code == 200 and regions.json() == {"regions": ["local"], "defaultRegion": "local"}

        submitted = await http.post("/api/v1/batches:submit", json={
            "billingProject": "proj", "idempotencyToken": "over-rest", "attributes": {"name": "over-rest"},
            "jobs": [{"image": "busybox", "argv": {"args": ["true"]}}]})
        assert submitted.status_code == 200, submitted.text
        rest_batch = submitted.json()["batch"]
        assert rest_batch["attributes"] == {"name": "over-rest"} and int(rest_batch["counts"]["nJobs"]) == 1

        jobs = await http.get(f"/api/v1/batches/{batch_id}/jobs?withParents=true&withAttempts=true")
        assert jobs.status_code == 200 and [int(j["jobId"]) for j in jobs.json()["jobs"]] == [1], jobs.text
        pools = await http.get("/api/v1/fleet/pools")  # an administrator's
        assert pools.status_code == 200, pools.text
        assert [p["name"] for p in pools.json()["pools"]] == ["highcpu", "highmem", "job-private", "standard"]
        instances = await http.get("/api/v1/fleet/instances?pool=standard&state=INSTANCE_STATE_ACTIVE")
        assert instances.status_code == 200 and instances.json().get("instances") is None, instances.text

        listed = await http.get("/api/v1/batches", headers={"traceparent": TRACEPARENT})
        assert listed.status_code == 200, listed.text
        ids = {int(b["batchId"]) for b in listed.json()["batches"]}
        assert {batch_id, int(rest_batch["batchId"])} <= ids
        request_id = listed.headers.get("x-request-id") or ""

    assert request_id  # given back to the caller, to quote when something went wrong

    def listing() -> list[dict]:  # type: ignore[type-arg]
        log = tmp_path / "gateway" / "access.log"  # Envoy flushes it about once a second
        lines = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        return [line for line in lines if line["request_id"] == request_id]

    await eventually(lambda: listing())
    line = listing()[0]
    assert line["method"] == "GET" and line["path"] == "/api/v1/batches" and line["response_code"] == 200
    assert line["traceparent"] == TRACEPARENT and line["upstream_cluster"] == "frontend"
    assert line["grpc_status"] == "OK" and line["protocol"] == "HTTP/1.1"


async def eventually(predicate, timeout_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.1)


TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


async def test_errors_come_back_as_json_status_with_their_http_code(gateway_port: int, frontend: FrontendApp,
                                                                   db: Database,
                                                                    certs: DevCertificateAuthority,
                                                                    admin_token: str) -> None:
    await JobStore(db).create_billing_project("proj", ["root"])
    async with rest(certs, gateway_port, admin_token) as http:
        missing = await http.get("/api/v1/batches/987654")
        assert missing.status_code == 404, missing.text
        assert missing.json()["code"] == grpc.StatusCode.NOT_FOUND.value[0]
        assert "987654" in missing.json()["message"] and "route" not in missing.json()["message"], missing.text

        # A bad job spec: INVALID_ARGUMENT, with its BadRequest field violations in the body.
        bad = await http.post("/api/v1/batches:submit", json={
            "billingProject": "proj", "idempotencyToken": "bad", "jobs": [{"image": "", "argv": {"args": []}}]})
        assert bad.status_code == 400, bad.text
        status = bad.json()
        assert status["code"] == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        details = {d["@type"]: d for d in status.get("details", [])}
        assert "type.googleapis.com/google.rpc.BadRequest" in details, status
        assert details["type.googleapis.com/google.rpc.BadRequest"]["fieldViolations"]

        # A body over the gateway's limit is refused there, before any service reads it.
        huge = await http.post("/api/v1/batches:submit", headers={"content-type": "application/json"},
                               content=b'{"billingProject": "' + b"x" * MAX_REQUEST_BYTES + b'"}')
        assert huge.status_code == 413, huge.text
        assert huge.json()["code"] == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], huge.text

        # What the gateway answers itself is a JSON google.rpc.Status too: a value the transcoder cannot
        # read, a query parameter the request does not have, a path no route has.
        for path, code in (("/api/v1/batches/not-a-number", grpc.StatusCode.INVALID_ARGUMENT),
                           ("/api/v1/batches?no_such_parameter=1", grpc.StatusCode.INVALID_ARGUMENT),
                           ("/api/v1/no-such-thing", grpc.StatusCode.NOT_FOUND)):
            answer = await http.get(path)
            assert answer.headers["content-type"] == "application/json", (path, answer.text)
            assert answer.status_code == (400 if code == grpc.StatusCode.INVALID_ARGUMENT else 404), answer.text
            assert answer.json()["code"] == code.value[0] and answer.json()["message"], (path, answer.text)

    async with rest(certs, gateway_port, "not-a-token") as http:
        refused = await http.get("/api/v1/batches")
        assert refused.status_code == 401, refused.text
        assert refused.json()["code"] == grpc.StatusCode.UNAUTHENTICATED.value[0]


async def test_the_openapi_document_is_served(gateway_port: int, certs: DevCertificateAuthority) -> None:
    """At a fixed path, without a token, exactly the document the package ships."""
    async with rest(certs, gateway_port, "unused") as http:
        served = await http.get("/api/v1/openapi.json", headers={"authorization": ""})
        assert served.status_code == 200, served.text
        assert served.headers["content-type"] == "application/json"
        assert served.content == (Path(corral.__file__).parent / "openapi.json").read_bytes()
        assert served.json()["swagger"] == "2.0"
        assert (await http.post("/api/v1/openapi.json", headers={"authorization": ""})).status_code == 404


async def test_watch_batch_and_a_followed_log_stream_json_lines(
        gateway_port: int, frontend: FrontendApp, db: Database, certs: DevCertificateAuthority, admin_token: str,
        driving: Driving) -> None:
    await JobStore(db).create_billing_project("proj", ["root"])
    async with rest(certs, gateway_port, admin_token) as http:
        submitted = await http.post("/api/v1/batches:submit", json={
            "billingProject": "proj", "idempotencyToken": "watched",
            "jobs": [{"image": "busybox", "argv": {"args": ["true"]}}]})
        batch_id = int(submitted.json()["batch"]["batchId"])
        async with http.stream("GET", f"/api/v1/batches/{batch_id}/events") as events, \
                http.stream("GET", f"/api/v1/batches/{batch_id}/jobs/1/log:stream") as followed:
            assert (events.status_code, followed.status_code) == (200, 200)
            lines = events.aiter_lines()
            first = json.loads(await anext(lines))  # arrives while the stream is open and the batch runs
            log_lines = (json.loads(line) async for line in followed.aiter_lines() if line.strip())
            assert await anext(log_lines) == {}  # the job has not run: the log's stream waits for it
            # The job runs and the batch completes: more lines on the same open stream (which stays open
            # until the client, having seen BatchCompleted, closes it).
            attempt = await driving.run(batch_id, 1, "Success")
            seen = [first]
            while "batchCompleted" not in seen[-1]["event"]:
                line = await anext(lines)
                if line.strip():
                    seen.append(json.loads(line))
            followed_lines = [line async for line in log_lines]  # the log's stream ends with the job
    # The attempt (it wrote no log here), then the state the job ended in.
    assert followed_lines == [{"attemptId": attempt, "attemptNumber": 1, "instanceName": "i1"},
                              {"attemptId": attempt, "jobState": "JOB_STATE_SUCCEEDED"}]
    kinds = [kind for line in seen for kind in line["event"] if kind not in ("batchId", "eventId", "at")]
    print(f"WatchBatch through the gateway: {len(seen)} JSON lines: {kinds}")
    assert kinds[0] == "updateCommitted" and "jobStateChanged" in kinds and kinds[-1] == "batchCompleted"
    assert [int(line["event"]["eventId"]) for line in seen] == list(range(1, len(seen) + 1))


async def test_reflection_lists_the_services_through_the_gateway(gateway_port: int,
                                                                 certs: DevCertificateAuthority) -> None:
    credentials = grpc.ssl_channel_credentials(certs.ca_cert_path.read_bytes())
    async with grpc.aio.secure_channel(f"localhost:{gateway_port}", credentials) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        answers = [a async for a in stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10)]
    names = {s.name for s in answers[0].list_services_response.service}
    assert {"corral.batch.v1.BatchService", "corral.billing.v1.BillingService"} <= names


async def test_buf_curl_and_curl_through_the_gateway(gateway_port: int, certs: DevCertificateAuthority,
                                                     admin_token: str) -> None:
    """People's own tools: `buf curl` lists the services by reflection and calls one in gRPC; `curl`
    calls REST over HTTP/1.1 and HTTP/2."""
    url, ca = f"https://localhost:{gateway_port}", str(certs.ca_cert_path)
    code, out, err = await buf_curl("--cacert", ca, "--list-services", url)
    assert code == 0, err
    assert {"corral.batch.v1.BatchService", "corral.billing.v1.BillingService"} <= set(out.split())
    code, out, err = await buf_curl("--cacert", ca, "-H", f"authorization: Bearer {admin_token}",
                                    f"{url}/corral.batch.v1.BatchService/ListBatches")
    assert code == 0, err
    for version in ("--http1.1", "--http2"):
        process = await asyncio.create_subprocess_exec(
            "curl", "-sS", version, "--cacert", ca, "-H", f"Authorization: Bearer {admin_token}",
            "-w", "\n%{http_code} %{http_version}", f"{url}/api/v1/auth/whoami",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out_bytes, err_bytes = await asyncio.wait_for(process.communicate(), timeout=30)
        body, _, status = out_bytes.decode().rpartition("\n")
        assert status in ("200 1.1", "200 2"), (version, status, err_bytes)
        assert json.loads(body)["user"]["username"] == "root", body


async def test_unknown_keys_are_refused_naming_the_key(gateway_port: int, frontend: FrontendApp, db: Database,
                                                       certs: DevCertificateAuthority, admin_token: str) -> None:
    """A body key no field of the request has (`imag` for `image`), which the transcoder alone drops without a
    word, is refused INVALID_ARGUMENT with its path and the nearest field, nothing submitted; so is an unknown
    query parameter, by the transcoder itself, naming it. Keys written either way (json or proto names), maps'
    own keys and a body past the connection buffer pass; gRPC is not touched."""
    await JobStore(db).create_billing_project("proj", ["root"])
    job = {"image": "busybox", "argv": {"args": ["true"]}, "env": {"ANY_KEY": "x"},
           "resources": {"memory_bytes": "1024"}}
    async with rest(certs, gateway_port, admin_token) as http:
        for body, message in (
                ({"billingProject": "proj", "idempotencyToken": "t1", "jobs": [job, {**job, "imag": "busybox"}]},
                 'jobs[1].imag: no such field in corral.batch.v1.JobSpec; did you mean "image"?'),
                ({"billingProject": "proj", "idempotencyToken": "t2", "attributs": {"a": "b"}, "jobs": [job]},
                 'attributs: no such field in corral.batch.v1.SubmitBatchRequest; did you mean "attributes"?'),
                ({"billingProject": "proj", "idempotencyToken": "t3",
                  "jobs": [{**job, "retryPolicy": {"maxFailedRetries": 1, "delay": "1s"}}]},
                 "jobs[0].retryPolicy.delay: no such field in corral.batch.v1.RetryPolicy"),
                ({"billingProject": "proj", "idempotencyToken": "t4", "jobs": [{**job, "\u00e9": 1}]},
                 "jobs[0].\u00e9: no such field in corral.batch.v1.JobSpec")):
            refused = await http.post("/api/v1/batches:submit", json=body)
            assert refused.status_code == 400, refused.text
            assert refused.json() == {"code": grpc.StatusCode.INVALID_ARGUMENT.value[0], "message": message}
        query = await http.get("/api/v1/batches?stat=running")
        assert query.status_code == 400 and '"stat"' in query.json()["message"], query.text
        assert (await http.get("/api/v1/batches")).json().get("batches") is None  # nothing was submitted

        many = [{**job, "attributes": {"note": "x" * 200}} for _ in range(180)]  # some 50 KB: past the 32 KiB
        accepted = await http.post("/api/v1/batches:submit", json={  # connection buffer
            "billingProject": "proj", "idempotency_token": "ok", "jobs": [*many, {**job, "image_pull_secret": ""}]})
        assert accepted.status_code == 200, accepted.text[:500]

    async with Client(f"localhost:{gateway_port}", admin_token, certs.ca_cert_path,
                      auth_address=f"localhost:{gateway_port}") as client:
        builder = BatchBuilder("proj")
        builder.job("busybox", ["true"])
        assert (await client.submit(builder)).batch_id
