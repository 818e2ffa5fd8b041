"""What `corral up` runs: its settings as one frozen dataclass, each field with its default and what it
means; the CLI (services.up.cli) builds it from the flags, and services.up.app.start runs it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

from services.common.image_refs import Mirror
from services.common.storage_access import StorageAccess
from services.common.worker_limits import WorkerLimits
from services.gateway.deployment import Limits
from services.up.supervisor import RestartPolicy

DEFAULT_GATEWAY_PORT = 8443
"""Where people reach corral with --gateway (envoy/local.yaml's public_listen)."""
DEFAULT_INTERNAL_GATEWAY_PORT = 8444
"""Where workers reach the leading driver with --gateway (envoy/local.yaml's internal_listen)."""


@dataclasses.dataclass(frozen=True)
class UpConfig:
    """What `corral up` runs."""

    data_dir: Path
    """Database, certificates, blobs and logs (kept across restarts)."""
    database_url: str | None = None
    """Use this database instead of a private MariaDB in the data directory."""
    n_drivers: int = 2
    """One leads, the others stand by."""
    client_config: Path | None = None
    """Where to write the CLI configuration (default: the CLI's own default)."""
    worker_cores: int | None = None
    """Cores each local worker declares, in every local pool (None: keep the stored setting, 2 at first)."""
    max_workers: int | None = None
    """Most local workers of each pool at once (None: keep the stored setting)."""
    heartbeat_timeout_s: float | None = None
    """Seconds without a session or heartbeat before a worker is declared dead (None: the driver's default)."""
    idle_timeout_s: float | None = None
    """Seconds a worker stays up with nothing to run (None: the driver's default)."""
    trace: bool = False
    """Trace every service to `<data_dir>/traces/<service>-<pid>.jsonl` (OpenTelemetry spans as JSON lines)."""
    storage_roots: tuple[str, ...] | None = None
    """URL templates jobs' files must lie under (`{project}`: the billing project); None: one per project
    in the data directory, `file://<data_dir>/storage/{project}/`."""
    callback_allow_networks: tuple[str, ...] = ()
    """Networks (CIDR) completion callbacks may reach although they are not public (e.g. 127.0.0.0/8)."""
    storage_access: StorageAccess = StorageAccess()
    """How workers reach gs:// and az:// storage roots: handed to the drivers, which hand it to each
    worker they start (paths of the secret files; only workers read them)."""
    unisolated_dev: bool = False
    """When not root, let local workers run jobs unisolated as this user instead of refusing them
    (development only: a job can then read everything the services can)."""
    restart_policy: RestartPolicy = RestartPolicy()
    """When a process that died is started again, and when `corral up` gives up and stops."""
    registry_url: str | None = None
    """corral's own registry, what `localhost/...` names (`http://host:port` for plain HTTP, else HTTPS),
    instead of running and seeding one in the data directory."""
    registry_port: int | None = None
    """The port of the registry `corral up` runs (its pull address, `127.0.0.1:PORT`, which jobs and the
    workers' caches name); None: the one kept in DATA/registry/ports.json, chosen at the first start."""
    registry_mirrors: tuple[Mirror, ...] = ()
    """The workers' mirrors (--registry-mirror); unless one is for docker.io, `corral up` adds
    `docker.io=<own registry>/docker.io`: the own registry serves the images it holds under `docker.io/`."""
    base_images: tuple[str, ...] = ("busybox", "debian", "python", "openjdk")
    """The base images (services.registry.seed.BASE_IMAGES) `corral up` builds, once, and seeds its registry
    with at each start, in `docker.io/library/NAME` (none with `registry_url`): building all four takes
    minutes at the first start (docs/images.md), busybox alone a second."""
    base_image_cache: Path | None = None
    """Where the built base images are kept instead of `<data_dir>/registry/seed`: a directory any number of
    deployments share (services.registry.seed_cache), so that each image is built once per machine (the
    test suite's, from $CORRAL_BASE_IMAGE_CACHE)."""
    allowed_registries: tuple[str, ...] = ()
    """Registries (`host[:port]`) jobs' images may come from although they are not public (the frontend's and
    the drivers' --allowed-registries); the own registry and the mirrors are allowed anyway."""
    worker_runtime: str = "auto"
    """How local workers run jobs: process, oci (crun or runc containers) or auto (oci where the machine can)."""
    metrics: bool = False
    """Every service and worker serves Prometheus metrics on a loopback port; the scrape targets are kept in
    `<data_dir>/metrics/targets.json` (Prometheus file_sd), workers coming and going."""
    gateway: bool = False
    """Run the public and internal Envoy gateways (services.up.gateway): people (the CLI profile, the printed
    address) reach corral only through the public one, workers the leading driver only through the internal
    one."""
    gateway_port: int = DEFAULT_GATEWAY_PORT
    """The public gateway's port on 127.0.0.1, the same at each start (0: a free one, chosen at each start)."""
    internal_gateway_port: int = DEFAULT_INTERNAL_GATEWAY_PORT
    """The internal gateway's port on 127.0.0.1 (0: a free one, chosen at each start)."""
    provider: str = "local"
    """Who makes the workers' machines (the drivers' --provider): local, gcp or azure. A cloud's machines
    enroll and reach the drivers through the internal gateway, so they need `gateway`."""
    provider_config: Path | None = None
    """The cloud's JSON configuration (the drivers' --provider-config), with a cloud provider."""
    gateway_limits: Limits = Limits()
    """What the gateways hold clients to (connections, timeouts, sizes); the connection cap is lowered to what
    this process may give Envoy in file descriptors (services.gateway.envoy_process.fitting)."""
    prepull: Mapping[str | None, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    """Images each local worker pulls when it starts, by pool (None: every pool); the drivers' --prepull."""
    worker_limits: WorkerLimits | None = None
    """What jobs may take of the workers' hosts (processes, how often storage is checked), handed to the drivers
    for every worker they start; None: the defaults, the deployment named after the data directory
    (services.common.worker_limits.deployment_of_data_dir)."""
    restore: Path | None = None
    """A backup (`corral db backup`) to load into the database first; it must be empty (services.db.backup)."""
