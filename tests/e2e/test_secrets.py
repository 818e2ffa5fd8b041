"""Issue 13, acceptance 6, on a real `corral up` (with tracing on): a job
reads its secret from a file and prints only its hash; no RPC returns the
value; a user of another project cannot mount it, nor learn whether it
exists; and afterwards the value, as written and in base64, is nowhere: not
in any table of the database (a dump of every row, the sealed column
included), not in any file under the working directory of `corral up`
(MariaDB's own files, the blob store with specs and logs, the services' and
workers' logs, the traces, the workers' scratch space, the CLI's
configuration), not in what `corral job` prints.
"""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import corral
from corral.errors import CorralError
from tests.e2e import cluster as up
from tests.e2e.cluster import Cluster

pytestmark = [pytest.mark.timeout(400),
              pytest.mark.skipif(os.geteuid() != 0, reason="the process runtime mounts secrets for isolated jobs "
                                                           "only (workers running as root)")]


@pytest.fixture(scope="module")
def work_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("secrets-up")


@pytest.fixture(scope="module")
def cluster(work_dir: Path) -> Iterator[Cluster]:
    yield from up.running(up.start(work_dir, "--idle-timeout", "20", "--trace"))


def files_holding(root: Path, needles: list[bytes]) -> list[str]:
    """Every regular file under `root` holding one of `needles` (read whole: the largest are MariaDB's)."""
    found = []
    for path in root.rglob("*"):
        try:
            if not stat.S_ISREG(path.lstat().st_mode):
                continue
            data = path.read_bytes()
        except (FileNotFoundError, PermissionError):  # a file that went away meanwhile
            continue
        if any(needle in data for needle in needles):
            found.append(str(path.relative_to(root)))
    return found


def every_row(cluster: Cluster) -> bytes:
    """A dump of every table of corral's database, as bytes (binary columns as they are)."""
    tables = [r["t"] for r in cluster.query(
        "SELECT table_name AS t FROM information_schema.tables WHERE table_schema = DATABASE() "
        "AND table_type = 'BASE TABLE'")]
    assert "secrets" in tables and "jobs" in tables
    dump = b""
    for table in tables:
        for row in cluster.query(f"SELECT * FROM `{table}`"):
            dump += b"|".join(v if isinstance(v, bytes) else str(v).encode() for v in row.values()) + b"\n"
    return dump


def events(client: corral.Client, batch: Any) -> list[Any]:
    """Every event of a complete batch (WatchBatch goes on after the last: stop there)."""
    seen = []
    for event in client.watch(batch.batch_id):
        seen.append(event)
        if event.event_id >= batch.last_event_id:
            return seen
    return seen


def test_a_job_reads_its_secret_and_the_value_is_nowhere_else(cluster: Cluster, work_dir: Path,
                                                              tmp_path: Path) -> None:
    value = secrets.token_hex(24)
    needles = [value.encode(), base64.b64encode(value.encode()), base64.b64encode(value.encode()).rstrip(b"=")]
    source = tmp_path / "password"  # outside the working directory searched below
    source.write_text(value)
    created = cluster.cli("secrets", "create", "db", "--project", "default", "--from-file", str(source))
    assert created.returncode == 0, created.stderr
    assert value not in created.stdout + created.stderr

    with cluster.client() as admin:
        admin.create_user("eve")
        admin.create_billing_project("other", ["eve"])
        _, eve_token = admin.create_token("e2e", username="eve")
        batch = corral.BatchBuilder("default", attributes={"test": "secrets"})
        batch.job("busybox", "sha256sum secrets/db/password | cut -d' ' -f1", secrets={"db": "/secrets/db"})
        batch_id = admin.submit(batch).batch_id
        done = admin.wait(batch_id)
        assert done.counts.n_succeeded == 1, done
        log = admin.job_log(batch_id, 1)
        assert log.strip() == hashlib.sha256(value.encode()).hexdigest().encode()
        # No RPC returns the value: what the admin may read of the job, the batch and the secret.
        answers = [admin.get_job(batch_id, 1), admin.get_batch(batch_id), *admin.jobs(batch_id),
                   *admin.secrets("default"), admin.explain_job(batch_id, 1), *events(admin, done)]
        assert not any(needle in a.SerializeToString() for a in answers for needle in needles)

    with corral.Client(cluster.frontend, eve_token, ca_cert=cluster.endpoints["ca_cert"]) as eve:
        for project, mount, code in (("other", "default/db", "PERMISSION_DENIED"),
                                     ("other", "default/missing", "PERMISSION_DENIED"),
                                     ("default", "db", "NOT_FOUND")):
            attempt = corral.BatchBuilder(project)
            attempt.job("busybox", "cat secrets/db/password", secrets={mount: "/secrets/db"})
            with pytest.raises(CorralError) as refused:
                eve.submit(attempt)
            assert refused.value.code.name == code, (project, mount, refused.value)
    assert cluster.query("SELECT COUNT(*) AS n FROM batches WHERE user = 'eve'") == [{"n": 0}]  # nothing written

    shown = cluster.cli("job", str(batch_id), "1")
    assert shown.returncode == 0, shown.stderr
    assert value not in shown.stdout
    assert not any(needle in every_row(cluster) for needle in needles)
    assert files_holding(work_dir, needles) == []
    assert "cli.json" in files_holding(work_dir, [cluster.admin_token.encode()])  # the search finds what is there
    sealed = cluster.query("SELECT sealed FROM secrets WHERE billing_project = 'default' AND name = 'db'")
    assert len(sealed) == 1 and len(sealed[0]["sealed"]) > len(value)  # stored, sealed
    traces = list((cluster.data_dir / "traces").glob("*.jsonl"))
    assert traces, "tracing was on: the traces are searched too"
