"""A job tries what a hostile tenant would, on a real `corral up`: every attempt fails.

The attacks of issue 9, run from inside a job of the process runtime (the
only runtime until the OCI runtime lands): read the CA's key, a service's
key, the drivers' worker issuer, a worker's key, the database passwords,
another job's spec (with its environment secret) and log, the CLI's
configuration with the administrator's token; see other processes'
arguments (the workers' activation tokens were there); log in to the private
MariaDB through its socket. The job prints DENIED or LEAK for each and exits
0; the test requires every DENIED and no LEAK. (The patterns are written
`[m]ariadbd` so that they do not find the job's own command line.) Files are also checked from
outside: nothing under the data directory is readable by other accounts
except what is meant to be (the CA certificate).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

import corral
from corral.batch.v1 import job_state_pb2
from services.common.registry_logins import read_login_file
from tests.e2e import cluster as up
from tests.e2e.cluster import Cluster

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(os.geteuid() != 0, reason="the process runtime isolates jobs only as root")]

SECRET = "tenant-b-secret-7c1e"

ATTACK = r"""
try() { what="$1"; shift; if "$@" >/dev/null 2>&1; then echo "LEAK $what"; else echo "DENIED $what"; fi; }
try ca-key             cat "$DATA/ca/ca.key"
try ca-dir             ls "$DATA/ca"
try frontend-key       cat "$DATA/certs/frontend/frontend.key"
try driver-key         cat "$DATA/certs/driver/driver.key"
try worker-issuer-key  cat "$DATA/certs/driver/worker-issuer.key"
try worker-keys        ls "$DATA/worker-certs"
try db-passwords       cat "$DATA/secrets/db-driver.password"
try db-admin-password  cat "$DATA/mariadb/admin.password"
try secrets-key        cat "$DATA/secrets/job-secrets.key"
try driver-secrets-key cat "$DATA/certs/driver/job-secrets.key"
try specs              sh -c "grep -r -l $SECRET '$DATA/blobs'"
try spec-dir           ls "$DATA/blobs/specs"
try logs               ls "$DATA/blobs/logs"
try service-logs       cat "$DATA/logs/driver-0.log"
try cli-config         cat "$CLI_CONFIG"
try root-cli-config    cat /root/.config/corral/config.json
try scratch-root       ls "$SCRATCH_PARENT"
try database-socket    mariadb --no-defaults --socket="$DATA/mariadb/mysqld.sock" -uroot -e "SELECT 1"
try other-processes    sh -c "ps -eo args | grep -e '[s]leep 20' -e '[s]ervices\.[a-z]' -e '[m]ariadbd'"
try driver-argv        sh -c "cat /proc/[0-9]*/cmdline | tr '\0' ' ' | grep -e '[-]m services\.' -e '[m]ariadbd' -e '[i]nstance-name'"
try other-environ      sh -c "cat /proc/[0-9]*/environ | tr '\0' '\n' | grep -e CORRAL_ACTIVATION_TOKEN -e CORRAL_DATABASE_URL"
try registry-logins    cat "$DATA/registry/logins/push.json"
try registry-pull-login cat "$DATA/certs/driver/registry-login.json"
try worker-pull-login  sh -c "cat $DATA/worker-certs/*/registry-login.json"
try registry-read      skopeo inspect --raw --tls-verify=false "docker://$REGISTRY/docker.io/library/busybox:latest"
id -u
"""

TARGETS = ("ca-key", "ca-dir", "frontend-key", "driver-key", "worker-issuer-key", "worker-keys", "db-passwords",
           "db-admin-password", "secrets-key", "driver-secrets-key", "specs", "spec-dir", "logs", "service-logs", "cli-config", "root-cli-config",
           "scratch-root", "database-socket", "other-processes", "driver-argv", "other-environ",
           # Issue 33: corral up's registry and its logins (a process-runtime job is on the host's network).
           "registry-logins", "registry-pull-login", "worker-pull-login", "registry-read")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    yield from up.running(up.start(tmp_path_factory.mktemp("tenancy"), "--idle-timeout", "20"))


def finished(client: corral.Client, batch_id: int) -> None:
    batch = client.wait(batch_id)
    assert batch.counts.n_succeeded == batch.counts.n_jobs, batch


def test_a_job_reaches_nothing_of_the_host_or_another_tenant(cluster: Cluster) -> None:
    data = cluster.data_dir
    with cluster.client() as admin:
        # Another tenant's job, with a secret in its environment and its log.
        victim = corral.BatchBuilder("default", attributes={"test": "victim"})
        victim.job("busybox", ["sh", "-c", "echo my secret is $SECRET; sleep 20"], env={"SECRET": SECRET})
        victim_id = admin.submit(victim).batch_id
        attacker = corral.BatchBuilder("default", attributes={"test": "attacker"})
        attacker.job("busybox", ATTACK, env={
            "DATA": str(data), "SECRET": SECRET, "CLI_CONFIG": cluster.env["CORRAL_CONFIG"],
            "SCRATCH_PARENT": str(data / "workers"), "REGISTRY": cluster.endpoints["registry"].removeprefix("http://")})
        attacker_id = admin.submit(attacker).batch_id
        finished(admin, attacker_id)
        log = admin.job_log(attacker_id, 1).decode()
        finished(admin, victim_id)
        assert SECRET in admin.job_log(victim_id, 1).decode()  # the victim's own log has it, for its owner
    lines = dict(line.split(" ", 1)[::-1] for line in log.splitlines() if line.startswith(("DENIED ", "LEAK ")))
    assert {target: lines.get(target) for target in TARGETS} == {target: "DENIED" for target in TARGETS}, log
    uid = int(log.strip().splitlines()[-1])
    assert uid != 0 and uid != os.getuid()


def test_nothing_in_the_data_directory_is_open_to_other_accounts(cluster: Cluster) -> None:
    data = cluster.data_dir
    assert stat.S_IMODE(data.stat().st_mode) == 0o711  # passable, not listable
    open_to_others = []
    for path in data.rglob("*"):
        try:
            mode = path.lstat().st_mode
        except FileNotFoundError:  # a worker's attempt directory, just removed
            continue
        if stat.S_ISLNK(mode) or stat.S_ISSOCK(mode):
            continue
        # What another account could read: a file readable by others behind directories it may pass.
        if mode & stat.S_IROTH and all(p.stat().st_mode & stat.S_IXOTH for p in path.parents if data in p.parents
                                       or p == data):
            open_to_others.append(str(path.relative_to(data)))
    assert open_to_others == ["ca.pem"]
    assert stat.S_IMODE((data / "mariadb").stat().st_mode) == 0o700  # the socket's directory
    for key in [*data.rglob("*.key"), *data.rglob("*.password")]:
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key


def test_services_hold_only_their_own_keys_and_no_secret_is_on_a_command_line(cluster: Cluster) -> None:
    certs = cluster.data_dir / "certs"
    held = {service.name: sorted(p.name for p in service.iterdir()) for service in certs.iterdir()}
    assert held == {
        "auth": ["auth.key", "auth.pem", "ca.pem"],
        "frontend": ["ca.pem", "frontend.key", "frontend.pem", "job-secrets.pub",  # seals secrets, cannot open
                     "registry-push-login.json"],  # imports projects' images (corral images)
        "driver": ["ca.pem", "driver.key", "driver.pem", "job-secrets.key", "registry-login.json",  # for its workers
                   "worker-issuer.key", "worker-issuer.pem"],
        "gateway": ["ca.pem", "gateway.key", "gateway.pem"],  # Envoy's, for the gateways (docs/gateway.md)
    }
    secrets = [(cluster.data_dir / "secrets" / f"db-{s}.password").read_text().strip()
               for s in ("auth", "frontend", "driver")]
    secrets.append((cluster.data_dir / "mariadb" / "admin.password").read_text().strip())
    secrets += [read_login_file(cluster.data_dir / "registry" / "logins" / name).password
                for name in ("pull.json", "push.json")]
    for pid in cluster.descendants():
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        assert not any(secret in argv for secret in secrets), argv
        assert "--activation-token" not in argv and "--database-url" not in argv, argv


def test_job_states_are_final_for_cancelled_attackers(cluster: Cluster) -> None:
    """A job cannot outlive its cancellation by leaving its process group (it has its own PID namespace)."""
    with cluster.client() as admin:
        builder = corral.BatchBuilder("default", attributes={"test": "escape"})
        builder.job("busybox", "setsid sh -c 'sleep 600' & sleep 600")
        batch_id = admin.submit(builder).batch_id
        up.eventually(lambda: admin.get_job(batch_id, 1).state == job_state_pb2.JOB_STATE_RUNNING, timeout_s=60)
        admin.cancel_batch(batch_id)
        admin.wait(batch_id)
    up.eventually(lambda: not any("sleep 600" in argv for argv in _command_lines()), timeout_s=30,
                  what="no sleeper left")


def _command_lines() -> list[str]:
    lines = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                lines.append((entry / "cmdline").read_bytes().decode(errors="replace").replace("\0", " "))
            except OSError:  # gone meanwhile
                pass
    return lines
