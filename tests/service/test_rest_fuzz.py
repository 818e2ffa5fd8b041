"""The REST API fuzzed from its own OpenAPI document (issue 14, acceptance 5): schemathesis generates
requests for every operation of corral/openapi.json and sends them through the real Envoy gateway to a
real auth service and frontend, with an administrator's token; no answer may be a server error or break
the document's schemas.

The default suite runs a short version (a few examples per operation, bounded in time); `-m slow` runs a
few hundred per operation. The command is in docs/gateway.md."""

from __future__ import annotations

import asyncio
import shutil
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

import corral
from services.common.tls import DevCertificateAuthority
from services.db.database import Database
from services.db.store import JobStore
from services.frontend.app import FrontendApp
from tests.service.test_gateway_public import gateway_port  # noqa: F401 - a fixture

OPENAPI = Path(corral.__file__).parent / "openapi.json"
SCHEMATHESIS = Path(sys.executable).parent / "st"
SESSION_ENDING = ("Logout", "RevokeToken", "DeactivateUser")


def streaming_operations() -> list[str]:
    """The server streams (WatchBatch, StreamJobLog, WatchSpend): they stay open until the client goes, which a
    fuzzer reads as a timeout. tests/service/test_gateway_public.py reads one as streamed JSON."""
    descriptors = descriptor_pb2.FileDescriptorSet.FromString((OPENAPI.parent / "descriptors.binpb").read_bytes())
    return sorted({m.name for f in descriptors.file if f.package.startswith("corral.") for s in f.service
                   for m in s.method if m.server_streaming})


CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"


async def fuzz(port: int, token: str, ca_cert: Path, report: Path, examples: int, max_time_s: int) -> tuple[int, str]:
    """Run schemathesis against the gateway; its exit code and output."""
    process = await asyncio.create_subprocess_exec(
        str(SCHEMATHESIS), "run", str(OPENAPI), "--url", f"https://localhost:{port}",
        "--header", f"Authorization: Bearer {token}", "--tls-verify", str(ca_cert),
        "--checks", CHECKS, "--max-examples", str(examples), "--max-time", str(max_time_s),
        # These end the session every other request uses (its token, its user); tests/service test them.
        *(a for operation in (*SESSION_ENDING, *streaming_operations()) for a in ("--exclude-operation-id", operation)),
        # One worker: with two threads, hypothesis's lambda descriptions parse source concurrently, and CPython
        # 3.11's AST constructor keeps its recursion depth per interpreter, not per thread, so a run fails with
        # "AST constructor recursion depth mismatch" now and then (python/cpython#106905).
        "--request-timeout", "30", "--workers", "1", "--no-color", "--report", "junit",
        "--report-junit-path", str(report),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, cwd=report.parent)
    out, _ = await process.communicate()
    return process.returncode or 0, out.decode(errors="replace")


@pytest.fixture
async def project(frontend: FrontendApp, db: Database) -> str:
    await JobStore(db).create_billing_project("proj", ["root"])
    return "proj"


@pytest.mark.timeout(240)
async def test_a_short_fuzz_finds_no_server_error(gateway_port: int, project: str,  # noqa: F811
                                                  certs: DevCertificateAuthority, admin_token: str,
                                                  tmp_path: Path) -> None:
    assert shutil.which(str(SCHEMATHESIS)), "schemathesis is a dev dependency (pyproject.toml)"
    code, out = await fuzz(gateway_port, admin_token, certs.ca_cert_path, tmp_path / "junit.xml", examples=2,
                           max_time_s=40)
    assert code == 0, out
    assert (tmp_path / "junit.xml").exists()


@pytest.mark.slow
@pytest.mark.timeout(1800)
async def test_a_long_fuzz_finds_no_server_error(gateway_port: int, project: str,  # noqa: F811
                                                 certs: DevCertificateAuthority, admin_token: str,
                                                 tmp_path: Path) -> None:
    code, out = await fuzz(gateway_port, admin_token, certs.ca_cert_path, tmp_path / "junit.xml", examples=300,
                           max_time_s=1500)
    assert code == 0, out
