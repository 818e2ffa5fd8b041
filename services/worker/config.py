"""What a worker process is told: its identity, its machine, and where the
drivers and storage are. The driver's local provider passes these as the
command line of `python -m services.worker`, but for the activation token,
which goes in its environment (a command line is there for anyone to read),
and the storage secrets, which stay in files only the worker reads."""

from __future__ import annotations

import dataclasses
import ipaddress
from pathlib import Path

from services.common.image_refs import Mirror
from services.common.storage_access import StorageAccess
from services.common.usage_series import DEFAULT_CAP as DEFAULT_USAGE_SAMPLES_CAP
from services.common.worker_limits import WorkerLimits

DEFAULT_IMAGE_CACHE_BYTES = 10 * 2**30
"""The image cache's size limit unless configured (10 GiB)."""


@dataclasses.dataclass(frozen=True)
class WorkerConfig:
    """How to run one worker."""

    instance_name: str
    """The instance the autoscaler recorded for this machine."""
    activation_token: str
    """Its one-time activation token: proves to the driver that this process is that machine."""
    cores_mcpu: int
    """Cores offered to jobs, in thousandths of a core."""
    driver_addresses: tuple[str, ...]
    """Every driver's internal address (host:port); the worker finds the leader among them."""
    certs_dir: Path
    """The dev CA's directory; the worker's certificate there is `worker-<instance_name>`."""
    scratch_dir: Path
    """Where attempts get their working directories and local logs."""
    log_root_url: str
    """fsspec URL under which finished logs go when a RunJob names no log_url."""
    storage_access: StorageAccess = StorageAccess()
    """How jobs' gs:// and az:// files are reached: endpoints, and the files holding the credentials."""
    memory_bytes: int = 0
    """Memory offered to jobs, in bytes (0: not declared)."""
    storage_bytes: int = 0
    """Scratch storage offered to jobs, in bytes (0: not declared)."""
    region: str = "local"
    """Region the machine is in."""
    listen_address: str = "127.0.0.1:0"
    """Where WorkerService listens (mutual TLS); port 0 picks a free port."""
    advertise_host: str = "127.0.0.1"
    """Host the driver records for WorkerService (instances.ip_address is advertise_host:port)."""
    heartbeat_interval_s: float = 5.0
    """Heartbeat period until the driver's Welcome says otherwise."""
    idle_timeout_s: float = 60.0
    """Idle time before deactivating, until the driver's Welcome says otherwise."""
    keep_ended_s: float = 600.0
    """How long the log of an ended attempt stays readable over WorkerService."""
    rpc_timeout_s: float = 10.0
    """Deadline of each unary call to a driver (GetLeader, ActivateWorker, DeactivateWorker)."""
    reconnect_max_backoff_s: float = 5.0
    """Longest wait between two rounds of looking for the leader."""
    leader_query_timeout_s: float = 2.0
    """Deadline of each GetLeader while looking for the leader: every driver is asked at once, and a
    paused one (it accepts the connection and never answers) must not hold up a round for long."""
    driver_silence_s: float = 10.0
    """How long the worker waits without a word from its driver (which acknowledges every heartbeat)
    before it takes the driver for paused or cut off, ends the session and looks for the leader
    again; never less than two heartbeat intervals. A paused leader cannot send anyone away."""
    shutdown_flush_s: float = 5.0
    """On SIGTERM, how long to wait for the driver to acknowledge completions before deactivating."""
    deactivate_timeout_s: float = 15.0
    """How long to keep trying DeactivateWorker before exiting anyway (the dead-worker detector
    then deactivates the instance)."""
    own_registry: str | None = None
    """corral's own registry, what `localhost/...` names: `http://host:port` (plain HTTP) or `https://host`
    (services.common.image_refs); None: the deployment has none."""
    own_registry_login_file: Path | None = None
    """A login file (0600; services.common.registry_logins) the worker pulls from the own registry with (as
    itself or as a mirror), whatever login a job brings: `corral up`'s registry asks for one. None:
    anonymously."""
    registry_mirrors: tuple[Mirror, ...] = ()
    """Registries that serve other registries' images, asked first (`docker.io` served by the own registry
    under `docker.io/`: services.worker.pull_sources)."""
    allowed_registries: tuple[str, ...] = ()
    """Registries (`host[:port]`) jobs' images may come from although they are not public; with the own
    registry and the mirrors, the only such ones (services.common.registry_rules)."""
    image_cache_dir: Path | None = None
    """The image cache (services.worker.images); None: `<scratch_dir>/images`."""
    image_cache_bytes: int = DEFAULT_IMAGE_CACHE_BYTES
    """Most disk the unpacked images of the cache may take, images in use aside."""
    prepull: tuple[str, ...] = ()
    """Images pulled into the cache when the worker starts, while it takes jobs (services.worker.prepull); a
    failed pull is logged, not fatal."""
    unisolated_dev: bool = False
    """If the worker cannot isolate jobs (it is not root), run them anyway, unisolated, as its own user
    (development only; each attempt's isolation note says so). Otherwise such a worker refuses them."""
    runtime: str = "process"
    """How jobs run: 'process' (the process runtime), 'oci' (each in a crun or runc container; refuses to start
    where it cannot), or 'auto' (oci where this machine can run it, else process, saying why)."""
    container_runtime: str = "auto"
    """What runs the OCI runtime's containers: 'crun', 'runc' or 'auto' (crun where it can run here, else runc;
    services/worker/oci/runc.py)."""
    oci_images_dir: Path | None = None
    """Where the OCI runtime finds images, unpacked: IMAGE is `DIR/IMAGE/rootfs` (until the worker has an
    image cache that pulls them). The OCI runtime needs it."""
    usage_interval_s: float = 5.0
    """How often each running attempt's resource usage is sampled (services/worker/usage_sampler.py)."""
    usage_samples_cap: int = DEFAULT_USAGE_SAMPLES_CAP
    """Most samples kept per attempt; a longer series is thinned evenly (services/worker/usage_series.py)."""
    private_networks: tuple[ipaddress.IPv4Network, ...] = ()
    """The deployment's private ranges: all a NETWORK_MODE_PRIVATE job in a container reaches, and what a
    PUBLIC one does not (services/worker/oci/network.py). None by default: private jobs reach nothing."""
    cloud: str | None = None
    """'gcp' or 'azure': the machine is that cloud's, and the worker watches its preemption notices
    (services/worker/preemption.py) at its metadata server. None: no cloud to watch (local workers)."""
    limits: WorkerLimits = WorkerLimits()
    """The deployment's limits on what jobs take of this host: the cgroups' names and process caps, how often a
    running job's processes and scratch storage are checked (services/worker/host_limits.py)."""
    renew_certificate: bool = False
    """Renew the worker's certificate over mutual TLS at two thirds of its life (an enrolled worker's is
    short-lived: services/worker/certificates.py). A local provider's worker keeps the one it was given."""
