"""grpcurl-style access with a real third-party client: the buf CLI's `buf curl`
(installed by scripts/setup.sh --for test into .tools/) discovers corral's services by
server reflection and calls them with JSON, over TLS with a bearer token on
the public listener and with a client certificate on the internal one."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path


from services.auth.app import AuthApp
from services.common.tls import DevCertificateAuthority
from services.db.database import Database
from services.db.store import JobStore
from services.frontend.app import FrontendApp

REPO_DIR = Path(__file__).resolve().parents[2]
BUF = REPO_DIR / ".tools" / "node_modules" / ".bin" / "buf"


async def buf_curl(*args: str) -> tuple[int, str, str]:
    """Run `buf curl` over gRPC; returns (exit code, stdout, stderr)."""
    assert BUF.exists(), "scripts/setup.sh --for test installs the buf CLI into .tools/"
    process = await asyncio.create_subprocess_exec(
        str(BUF), "curl", "--protocol", "grpc", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_reflection_lists_the_public_services_and_a_json_call_works(
        frontend: FrontendApp, certs: DevCertificateAuthority, admin_token: str, db: Database) -> None:
    url = f"https://localhost:{frontend.public_port}"
    ca = str(certs.ca_cert_path)

    code, out, err = await buf_curl("--cacert", ca, "--list-services", url)
    assert code == 0, err
    services = set(out.split())
    assert {"corral.batch.v1.BatchService", "corral.billing.v1.BillingService", "grpc.health.v1.Health"} <= services

    code, out, err = await buf_curl("--cacert", ca, "--list-methods", url)
    assert code == 0, err
    assert "corral.batch.v1.BatchService/SubmitBatch" in out.split()

    await JobStore(db).create_billing_project("proj", ["root"])
    request = {"billingProject": "proj", "idempotencyToken": "from-buf", "attributes": {"name": "from-buf"},
               "jobs": [{"image": "busybox", "argv": {"args": ["true"]}}]}
    code, out, err = await buf_curl("--cacert", ca, "-H", f"authorization: Bearer {admin_token}",
                                    "-d", json.dumps(request), f"{url}/corral.batch.v1.BatchService/SubmitBatch")
    assert code == 0, err
    batch = json.loads(out)["batch"]
    assert batch["billingProject"] == "proj" and batch["attributes"] == {"name": "from-buf"}
    assert int(batch["counts"]["nJobs"]) == 1

    # Without a token the method is refused with the gRPC status, which buf prints.
    code, out, err = await buf_curl("--cacert", ca, "-d", json.dumps(request),
                                    f"{url}/corral.batch.v1.BatchService/SubmitBatch")
    assert code != 0 and "unauthenticated" in err.lower()


async def test_internal_listener_needs_a_client_certificate(auth_app: AuthApp,
                                                            certs: DevCertificateAuthority) -> None:
    url = f"https://localhost:{auth_app.internal_port}"
    ca = str(certs.ca_cert_path)
    tls = certs.issue("frontend")

    code, out, err = await buf_curl("--cacert", ca, "--cert", str(tls.cert), "--key", str(tls.key),
                                    "--list-services", url)
    assert code == 0, err
    assert "corral.auth.v1.AuthService" in out.split()

    # The server ends the handshake (PEER_DID_NOT_RETURN_A_CERTIFICATE); the
    # client sees the server as unavailable or its connection cut, by timing.
    code, out, err = await buf_curl("--cacert", ca, "--list-services", url)
    assert code != 0 and ("unavailable" in err.lower() or "broken pipe" in err.lower()), err
    assert "corral.auth.v1.AuthService" not in out
