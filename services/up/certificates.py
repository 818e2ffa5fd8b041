"""`corral up`'s certificates and keys, in the data directory: a development CA (DATA/ca, 0700, kept across
restarts), a directory per service holding only its own certificate and key (DATA/certs/NAME, 0700), the CA's
certificate for clients (DATA/ca.pem), and the key pair job secrets are sealed for (DATA/secrets); also the
names of the secret files `corral up` hands its services beside their certificates."""

from __future__ import annotations

from pathlib import Path

from services.common.files import write_atomically
from services.common.sealing import ensure_key_files
from services.common.tls import SERVICE_IDENTITIES, WORKER_ISSUER, DevCertificateAuthority


def certificates(data: Path) -> tuple[DevCertificateAuthority, dict[str, Path]]:
    """The CA (kept in DATA/ca, 0700) and a directory per service holding only its own key and
    certificate; the drivers' also holds the worker issuer. A data directory from before keeps its CA:
    DATA/certs, which held the CA's key beside every service's, becomes DATA/ca."""
    ca_dir, certs = data / "ca", data / "certs"
    if not ca_dir.exists() and (certs / "ca.key").exists():
        certs.rename(ca_dir)
    ca = DevCertificateAuthority(ca_dir)
    ca.ensure()
    certs.mkdir(exist_ok=True)
    certs.chmod(0o700)
    dirs = {}
    for identity in SERVICE_IDENTITIES:
        dirs[identity] = ca.provision(identity, certs / identity).key.parent
    ca.provision(WORKER_ISSUER, dirs["driver"])
    write_atomically(data / "ca.pem", ca.ca_cert_path.read_bytes(), 0o644)
    return ca, dirs


GATEWAY_TOKEN_FILE = "gateway.token"
"""In auth's certificate directory: the secret the public gateway adds to the calls it forwards to auth, made
anew at each start (its config holds it too, in DATA/gateway, 0600)."""
REGISTRY_LOGIN = "registry-login.json"
"""In the drivers' certificate directory: the pull login of corral up's registry, which the local provider
copies into each worker's certificate directory (services.registry.local)."""
REGISTRY_PUSH_LOGIN = "registry-push-login.json"
"""In the frontend's certificate directory: the push login of corral up's registry, with which it imports
projects' images (`corral images import`); no other service holds it (services.registry.local)."""
WEB_IDENTITY = "web"
"""The web UI's certificate identity (DATA/certs/web): it serves the gateway alone, and is no service role (it
calls corral with its users' tokens, never with its certificate)."""
SECRETS_KEY = "job-secrets.key"
SECRETS_PUBLIC_KEY = "job-secrets.pub"


def secrets_keys(data: Path, certs: dict[str, Path]) -> tuple[Path, Path]:
    """The key pair job secrets are sealed for: made once in DATA/secrets (never replaced: every stored secret
    needs it), its private half copied into the drivers' directory (they alone open secrets), its public half
    into the frontend's (it seals them and cannot open them). Returns (drivers' key, frontend's key)."""
    keys = data / "secrets"
    keys.mkdir(mode=0o700, exist_ok=True)
    private, public = certs["driver"] / SECRETS_KEY, certs["frontend"] / SECRETS_PUBLIC_KEY
    ensure_key_files(keys / SECRETS_KEY, public)
    write_atomically(private, (keys / SECRETS_KEY).read_bytes(), 0o600)
    return private, public
