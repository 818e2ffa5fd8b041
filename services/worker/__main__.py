"""python -m services.worker --instance-name NAME --cores-mcpu N --driver-addresses HOST:PORT[,...]
--certs-dir DIR --scratch-dir DIR --log-root-url URL, with the one-time activation token in the
environment as CORRAL_ACTIVATION_TOKEN (never on the command line, which every local user can read).

On a cloud machine: python -m services.worker --cloud gcp|azure [--certs-dir DIR] [more options]. The
worker reads its boot data from the cloud's metadata server (services/worker/cloud.py): its instance
name, one-time token, where to enroll and the drivers are, the CA, and the rest of its command line
(`worker_args`). It makes its key, enrolls for its certificate, then runs as a worker started with
--instance-name, --certs-dir, --driver-addresses and those arguments would; it renews its certificate
and watches the cloud's preemption notices."""

import argparse
import asyncio
import ipaddress
import logging
import os
import sys
from pathlib import Path

from services.common import metrics
from services.common.entry import (
    OWN_REGISTRY_HELP,
    add_allowed_registries,
    add_registry_mirrors,
    allowed_registries,
    private_files,
)
from services.common.prepull import MAX_IMAGES as MAX_PREPULL_IMAGES, images_argument as prepull_images
from services.common.storage_access import StorageAccess, add_arguments as add_storage_access
from services.common.worker_limits import WorkerLimits, add_arguments as add_worker_limits
from services.driver.providers.worker_metadata import WorkerBootstrap
from services.worker.app import run
from services.worker.certificates import enroll, enroll_at
from services.worker.cloud import CLOUDS, MetadataError, read_bootstrap
from services.worker.config import WorkerConfig

TOKEN_VARIABLE = "CORRAL_ACTIVATION_TOKEN"


def networks(text: str) -> tuple[ipaddress.IPv4Network, ...]:
    """`CIDR,...` as IPv4 networks."""
    try:
        return tuple(ipaddress.IPv4Network(part.strip()) for part in text.split(",") if part.strip())
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


DEFAULT_CLOUD_CERTS_DIR = Path("/var/lib/corral/worker-certs")
"""Where a cloud worker keeps its key and certificate unless --certs-dir says otherwise."""
FROM_BOOT_DATA = ("--instance-name", "--driver-addresses", "--certs-dir", "--cloud", "--enroll-address")
"""Options a cloud worker takes from its boot data (or its own command line), never from `worker_args`."""

parser = argparse.ArgumentParser(prog="python -m services.worker", description=__doc__)
parser.add_argument("--cloud", choices=CLOUDS,
                    help="this is a cloud machine: read the boot data from the cloud's metadata server, enroll "
                         "for a certificate with its one-time token, renew it, and watch for preemption")
parser.add_argument("--instance-name", required=True)
parser.add_argument("--enroll-address", metavar="HOST:PORT",
                    help="make this worker's key and enroll for its certificate here with its one-time token (the "
                         "CA certificate in CERTS_DIR/ca.pem), then renew it; default: use the certificate and key "
                         "in CERTS_DIR (what a cloud worker does, from its boot data)")
parser.add_argument("--cores-mcpu", type=int, required=True)
parser.add_argument("--memory-bytes", type=int, default=0)
parser.add_argument("--storage-bytes", type=int, default=0)
parser.add_argument("--region", default="local")
parser.add_argument("--driver-addresses", required=True, help="every driver's address, comma-separated")
parser.add_argument("--certs-dir", type=Path, required=True)
parser.add_argument("--scratch-dir", type=Path, required=True)
parser.add_argument("--log-root-url", required=True)
add_storage_access(parser)
add_worker_limits(parser)
parser.add_argument("--listen-address", default="127.0.0.1:0")
parser.add_argument("--advertise-host", default="127.0.0.1")
parser.add_argument("--driver-silence", type=float, default=WorkerConfig.driver_silence_s,
                    help="seconds without a word from the driver (it acknowledges every heartbeat) before looking "
                         "for the leader again; at least two heartbeat intervals (default: %(default)s)")
parser.add_argument("--unisolated-dev", action="store_true",
                    help="when not root, run jobs unisolated as this worker's own user instead of refusing them "
                         "(development only: a job can then read everything the worker can)")
parser.add_argument("--own-registry", metavar="URL", help=f"{OWN_REGISTRY_HELP} (default: none)")
parser.add_argument("--own-registry-login-file", type=Path, metavar="FILE",
                    help="pull from the own registry (as itself or as a mirror) with this login, whatever a job "
                         "brings: a JSON file, 0600, {\"username\": ..., \"password\": ...} (default: anonymously)")
add_registry_mirrors(parser)
add_allowed_registries(parser)
parser.add_argument("--image-cache-dir", type=Path, help="the image cache (default: SCRATCH_DIR/images)")
parser.add_argument("--image-cache-bytes", type=int, default=WorkerConfig.image_cache_bytes,
                    help="most disk the cached images may take, images in use aside (default: %(default)s)")
parser.add_argument("--prepull", type=prepull_images, default=(), metavar="IMAGE[,IMAGE...]",
                    help="images to pull into the cache when the worker starts, while it takes jobs (at most "
                         f"{MAX_PREPULL_IMAGES}); a failed pull is logged, not fatal (default: none)")
parser.add_argument("--runtime", choices=("process", "oci", "auto"), default=WorkerConfig.runtime,
                    help="how jobs run: process, oci (crun or runc containers; the worker does not start where it "
                         "cannot) or auto (oci where possible, else process) (default: %(default)s)")
parser.add_argument("--container-runtime", choices=("auto", "crun", "runc"), default=WorkerConfig.container_runtime,
                    help="what runs the OCI runtime's containers: crun, runc or auto (crun where this host's cgroups "
                         "let it run, else runc) (default: %(default)s)")
parser.add_argument("--oci-images-dir", type=Path,
                    help="the OCI runtime's images, unpacked: IMAGE is DIR/IMAGE/rootfs (with DIR/IMAGE/config.json, "
                         "optionally, as umoci unpack writes it)")
parser.add_argument("--private-networks", type=networks, default=(), metavar="CIDR,...",
                    help="the deployment's private IPv4 ranges: all that network_mode private jobs in containers "
                         "reach (never 10.199.0.0/16, the job networks), and what public ones do not, whatever "
                         "their addresses; public jobs reach no private range anyway (default: none)")
parser.add_argument("--usage-interval-s", type=float, default=WorkerConfig.usage_interval_s,
                    help="seconds between two samples of each running job's resource usage (default: %(default)s)")
metrics.add_arguments(parser)
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")


def cloud_argv(cloud: str, argv: list[str]) -> tuple[list[str], str]:
    """The whole command line of a cloud worker, its boot data's `worker_args` and identity first, then the
    options given here; and its activation token. Enrolls for its certificate on the way. Exits on failure:
    without boot data or a certificate, a cloud worker cannot be one."""
    given = argparse.ArgumentParser(add_help=False)
    given.add_argument("--certs-dir", type=Path, default=DEFAULT_CLOUD_CERTS_DIR)
    known, rest = given.parse_known_args(argv)
    if overridden := [a for a in rest if a.split("=", 1)[0] in FROM_BOOT_DATA]:
        parser.error(f"with --cloud, {', '.join(overridden)} come from the boot data")
    try:
        bootstrap: WorkerBootstrap = asyncio.run(read_bootstrap(cloud))
    except MetadataError as e:
        parser.exit(3, f"worker: {e}\n")
    smuggled = [a for a in bootstrap.worker_args if a.split("=", 1)[0] in FROM_BOOT_DATA]
    if smuggled:
        parser.exit(3, f"worker: the boot data's worker_args may not set {', '.join(smuggled)}\n")
    try:
        asyncio.run(enroll(bootstrap, known.certs_dir))
    except Exception as e:  # noqa: BLE001 - any failure to enroll ends the worker, saying why
        parser.exit(3, f"worker: enrolling {bootstrap.instance_name} at {bootstrap.enroll_address} failed: {e}\n")
    return [*bootstrap.worker_args, "--instance-name", bootstrap.instance_name,
            "--driver-addresses", ",".join(bootstrap.driver_addresses), "--certs-dir", str(known.certs_dir),
            *rest], bootstrap.activation_token


first = argparse.ArgumentParser(add_help=False)
first.add_argument("--cloud", choices=CLOUDS)
cloud, without_cloud = first.parse_known_args()
token = ""
if cloud.cloud is not None:
    argv, token = cloud_argv(cloud.cloud, without_cloud)
    args = parser.parse_args(argv)
    args.cloud = cloud.cloud
else:
    args = parser.parse_args()
if args.usage_interval_s <= 0:
    parser.error("--usage-interval-s must be positive")
if problems := WorkerLimits.from_args(args).problems():
    parser.error("; ".join(problems))
private_files()
metrics.serve_for_process(args, f"worker-{args.instance_name}")
token = token or os.environ.get(TOKEN_VARIABLE, "")
os.environ.pop(TOKEN_VARIABLE, None)  # nothing this process starts inherits it
if not token:
    parser.error(f"the activation token goes in the environment variable {TOKEN_VARIABLE}")
if args.enroll_address:
    try:
        asyncio.run(enroll_at(args.enroll_address, args.instance_name, token, args.certs_dir))
    except Exception as e:  # noqa: BLE001 - any failure to enroll ends the worker, saying why
        parser.exit(3, f"worker: enrolling {args.instance_name} at {args.enroll_address} failed: {e}\n")
sys.exit(asyncio.run(run(WorkerConfig(
    args.instance_name, token, args.cores_mcpu,
    tuple(filter(None, args.driver_addresses.split(","))), args.certs_dir, args.scratch_dir, args.log_root_url,
    storage_access=StorageAccess.from_args(args),
    memory_bytes=args.memory_bytes, storage_bytes=args.storage_bytes, region=args.region,
    listen_address=args.listen_address, advertise_host=args.advertise_host, unisolated_dev=args.unisolated_dev,
    driver_silence_s=args.driver_silence, own_registry=args.own_registry,
    own_registry_login_file=args.own_registry_login_file, registry_mirrors=tuple(args.registry_mirrors),
    allowed_registries=allowed_registries(args.allowed_registries),
    image_cache_dir=args.image_cache_dir, image_cache_bytes=args.image_cache_bytes, prepull=args.prepull,
    runtime=args.runtime, container_runtime=args.container_runtime, oci_images_dir=args.oci_images_dir,
    private_networks=args.private_networks,
    usage_interval_s=args.usage_interval_s, cloud=args.cloud, limits=WorkerLimits.from_args(args),
    renew_certificate=args.cloud is not None or bool(args.enroll_address)))))
