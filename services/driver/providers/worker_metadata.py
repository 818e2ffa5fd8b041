"""What a cloud machine is told at boot, and nothing more: the contract between a provider (which
puts it in the instance's metadata) and the worker (which reads it from its cloud's metadata server).

It carries a one-time activation token and the CA certificate, never a key: the worker makes its own
key and enrolls with the token (issue 16's bootstrap). Where it travels:

- GCP: the instance metadata item `corral-worker` (read at
  `{metadata}/instance/attributes/corral-worker` with `Metadata-Flavor: Google`); the `startup-script`
  item starts the worker;
- Azure: the VM's `userData`, base64 of this JSON (read at
  `{metadata}/instance/compute/userData?api-version=2021-01-01&format=text` with `Metadata: true`); its
  `customData` (cloud-init) starts the worker.

`{metadata}` is the cloud's metadata root (`http://metadata.google.internal/computeMetadata/v1`,
`http://169.254.169.254/metadata`), or `CORRAL_CLOUD_METADATA_URL` when set: the tests' loopback clouds
give each "machine" a root of its own.
"""

from __future__ import annotations

import dataclasses
import json

METADATA_KEY = "corral-worker"
"""GCP: the instance metadata item holding the JSON."""
METADATA_URL_ENV = "CORRAL_CLOUD_METADATA_URL"
MAX_BYTES = 64 * 1024
"""Bigger is refused on both sides (GCP's metadata value limit is 256 KB, Azure's userData 64 KB)."""


@dataclasses.dataclass(frozen=True)
class WorkerBootstrap:
    instance_name: str
    activation_token: str
    """One-time and short-lived: exchanged once for the worker's certificate, then for its session."""
    enroll_address: str
    """host:port where a worker without a certificate may enroll (TLS, server-authenticated only)."""
    driver_addresses: tuple[str, ...]
    """The internal gateway (mTLS with the enrolled certificate)."""
    ca_cert_pem: str
    """The deployment CA, to authenticate `enroll_address` and the drivers."""
    worker_args: tuple[str, ...]
    """The rest of `python -m services.worker`'s command line: --cores-mcpu, --region, --runtime,
    --log-root-url, ... (never --certs-dir, --driver-addresses or --instance-name: those come from here)."""

    def to_json(self) -> str:
        text = json.dumps(dataclasses.asdict(self), separators=(",", ":"), sort_keys=True)
        if len(text.encode()) > MAX_BYTES:
            raise ValueError(f"worker bootstrap is {len(text.encode())} bytes; at most {MAX_BYTES}")
        return text

    @classmethod
    def from_json(cls, text: str | bytes) -> WorkerBootstrap:
        raw = text.encode() if isinstance(text, str) else text
        if len(raw) > MAX_BYTES:
            raise ValueError(f"worker bootstrap is {len(raw)} bytes; at most {MAX_BYTES}")
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError("worker bootstrap is not a JSON object")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        if set(data) != set(fields):
            raise ValueError(f"worker bootstrap has fields {sorted(data)}; expected {sorted(fields)}")
        for name in ("instance_name", "activation_token", "enroll_address", "ca_cert_pem"):
            if not isinstance(data[name], str) or not data[name]:
                raise ValueError(f"worker bootstrap: {name} must be a non-empty string")
        for name in ("driver_addresses", "worker_args"):
            if not isinstance(data[name], list) or not all(isinstance(v, str) for v in data[name]):
                raise ValueError(f"worker bootstrap: {name} must be a list of strings")
        return cls(data["instance_name"], data["activation_token"], data["enroll_address"],
                   tuple(data["driver_addresses"]), data["ca_cert_pem"], tuple(data["worker_args"]))
