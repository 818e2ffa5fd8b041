"""`corral up`: run the whole system on this machine (services.up.serve). A command of the server package,
registered under the `corral.commands` entry points (corral/cli.py); it imports the server's code only when
`corral up` runs, as every `corral` command loads this module."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from corral.errors import UsageError
from services.common.entry import (
    add_allowed_registries,
    add_registry_mirrors,
    add_url_settings,
    allowed_networks,
    allowed_registries,
)
from services.common.image_refs import InvalidImageReference, Registry
from services.common.prepull import pool_images
from services.common.registry_rules import RegistryRules
from services.common.storage_access import StorageAccess, add_arguments as add_storage_access
from services.common.worker_limits import WorkerLimits, add_arguments as add_worker_limits, deployment_of_data_dir

if TYPE_CHECKING:
    from services.gateway.deployment import Limits


def _up(args: argparse.Namespace) -> int:
    # Server-side code, imported only for this command.
    from services.up.config import UpConfig
    from services.up.serve import serve_forever
    from services.up.supervisor import RestartPolicy
    from services.worker.oci.runtime import host_refusals as oci_host_refusals

    storage_access = StorageAccess.from_args(args)
    if problems := storage_access.problems():
        raise UsageError("; ".join(problems))
    if args.deployment is None:
        args.deployment = deployment_of_data_dir(args.data_dir)
    worker_limits = WorkerLimits.from_args(args)
    if problems := worker_limits.problems():
        raise UsageError("; ".join(problems))
    if args.worker_runtime == "oci" and (why_not := oci_host_refusals()):
        raise UsageError("--worker-runtime oci: this machine cannot run containers: " + "; ".join(why_not))
    if args.provider != "local" and (args.provider_config is None or not args.gateway or args.unisolated_dev):
        raise UsageError(f"--provider {args.provider} needs --provider-config and the gateways (its machines enroll "
                         "and reach the drivers through the internal one), and takes no --unisolated-dev (about "
                         "local workers)")
    if args.provider != "local" and not args.provider_config.is_file():
        raise UsageError(f"--provider-config {args.provider_config}: no such file")
    if args.provider == "local" and args.provider_config is not None:
        raise UsageError("--provider-config is for --provider gcp or azure")
    if args.registry is not None and args.registry_port is not None:
        raise UsageError("--registry-port is the port of the registry corral up runs; with --registry it runs none")
    if args.registry_port == 0:
        raise UsageError("--registry-port 0: the registry keeps one port across starts; name one (1-65535)")
    gateway_limits = gateway_limits_of(args)
    registries = allowed_registries(args.allowed_registries)
    try:
        prepull = pool_images(args.prepull)
    except ValueError as e:
        raise UsageError(f"--prepull: {e}") from None
    try:
        RegistryRules.of(args.registry, registries, args.registry_mirrors)
    except ValueError as e:
        raise UsageError(f"--allowed-registries: {e}") from None
    # Unset ports keep UpConfig's defaults (the help names them: this module imports no server code).
    ports = {name: getattr(args, name) for name in ("gateway_port", "internal_gateway_port")
             if getattr(args, name) is not None}
    return serve_forever(UpConfig(args.data_dir, args.database_url, args.drivers, worker_cores=args.worker_cores,
                                  max_workers=args.max_workers, heartbeat_timeout_s=args.heartbeat_timeout,
                                  idle_timeout_s=args.idle_timeout, trace=args.trace,
                                  storage_roots=tuple(args.storage_root) if args.storage_root else None,
                                  callback_allow_networks=allowed_networks(args.callback_allow_networks),
                                  unisolated_dev=args.unisolated_dev,
                                  storage_access=storage_access,
                                  restart_policy=RestartPolicy(tries=args.restart_tries),
                                  registry_url=args.registry, allowed_registries=registries,
                                  **({} if args.base_images is None else {"base_images": args.base_images}),
                                  base_image_cache=(args.base_image_cache.expanduser().resolve()
                                                    if args.base_image_cache else None),
                                  registry_port=args.registry_port,
                                  restore=args.restore.expanduser().resolve() if args.restore else None,
                                  registry_mirrors=tuple(args.registry_mirrors),
                                  worker_runtime=args.worker_runtime,
                                  metrics=args.metrics, gateway=args.gateway, provider=args.provider,
                                  provider_config=args.provider_config.resolve() if args.provider_config else None,
                                  gateway_limits=gateway_limits, worker_limits=worker_limits, prepull=prepull,
                                  **ports))


GATEWAY_LIMITS = {
    "max_connections": (int, "N", "most client connections each gateway holds at once; past it a new one is closed "
                                  "as it is accepted (default: 50000, lowered to what ulimit -Hn allows)"),
    "request_headers_timeout_s": (float, "SECONDS", "a request whose headers are not all in this long is reset "
                                                    "(default: 10)"),
    "idle_timeout_s": (float, "SECONDS", "a connection with no request under way is closed after this long "
                                         "(default: 10)"),
    "stream_idle_timeout_s": (float, "SECONDS", "a request with no bytes either way this long is reset; server "
                                                "streams such as WatchBatch are exempt (default: 300)"),
    "request_timeout_s": (float, "SECONDS", "a request whose body is not all in this long is ended (default: 120)"),
    "tls_handshake_timeout_s": (float, "SECONDS", "a connection whose TLS handshake is not done this long after it "
                                                  "was accepted is closed (default: 10)"),
}
"""The gateways' limits (services.gateway.deployment.Limits) `corral up` takes as flags: --gateway-FIELD, with the
field's `_s` left out of the flag's name."""


def gateway_limits_of(args: argparse.Namespace) -> Limits:
    """The gateways' limits the --gateway-* flags ask for, the others at their defaults. Raises UsageError for a
    value Limits refuses, or a connection cap Envoy could not be given the file descriptors for."""
    from services.gateway.deployment import Limits
    from services.gateway.envoy_process import fd_hard_limit
    from services.gateway.hardening import FD_RESERVE

    try:
        limits = Limits(**{field: getattr(args, f"gateway_{field}") for field in GATEWAY_LIMITS
                           if getattr(args, f"gateway_{field}", None) is not None})
    except ValueError as e:
        raise UsageError(f"--gateway-*: {e}") from None
    room = fd_hard_limit() - FD_RESERVE
    if getattr(args, "gateway_max_connections", None) is not None and limits.max_connections > room:
        raise UsageError(f"--gateway-max-connections {limits.max_connections}: this user may give Envoy "
                         f"{room + FD_RESERVE} file descriptors (ulimit -Hn), {FD_RESERVE} of which it keeps for its "
                         f"upstreams and files: at most {room} (without the flag, corral up lowers the cap to fit)")
    return limits


def _registry_url(text: str) -> str:
    try:
        return Registry.parse(text).url
    except InvalidImageReference as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _base_images(text: str) -> tuple[str, ...]:
    from services.registry.seed import BASE_IMAGES  # only when the flag is given: it is server code

    names = tuple(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
    if unknown := [name for name in names if name not in BASE_IMAGES]:
        raise argparse.ArgumentTypeError(f"no base image {', '.join(map(repr, unknown))}: the base images are "
                                         f"{', '.join(BASE_IMAGES)}")
    return names


def _port(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (0-65535)")
    return int(text)


def add_commands(commands: argparse._SubParsersAction) -> None:
    """Add `up`."""
    up = commands.add_parser("up", help="run corral on this machine until Ctrl-C")
    up.add_argument("--data-dir", type=Path, default=Path("~/.local/share/corral"),
                    help="state kept across restarts (default: %(default)s)")
    up.add_argument("--database-url", default=os.environ.get("CORRAL_DATABASE_URL"),
                    help="use this MySQL/MariaDB (an administrator's URL: corral up migrates it and creates the "
                         "services' accounts) instead of a private MariaDB (default: $CORRAL_DATABASE_URL)")
    up.add_argument("--restore", type=Path, metavar="FILE",
                    help="first load this backup (`corral db backup`) into the database, which must be empty: a "
                         "data directory whose mariadb/ was lost, or a new --database-url database")
    up.add_argument("--drivers", type=int, default=2, help="driver processes: one leads (default: 2)")
    up.add_argument("--worker-cores", type=int, help="cores each local worker declares (kept; first default 2)")
    up.add_argument("--max-workers", type=int, help="most local workers per pool at once (kept; first default "
                                                    "4 standard, 2 highcpu, 2 highmem)")
    up.add_argument("--heartbeat-timeout", type=float, metavar="SECONDS",
                    help="declare a worker dead after this long without a session or heartbeat (default 30)")
    up.add_argument("--idle-timeout", type=float, metavar="SECONDS",
                    help="a worker with nothing to run exits after this long (default 60)")
    up.add_argument("--trace", action="store_true",
                    help="write OpenTelemetry spans of every service to DATA_DIR/traces/*.jsonl")
    up.add_argument("--metrics", action="store_true",
                    help="every service and worker serves Prometheus metrics on a loopback port; print the "
                         "scrape targets, and keep them in DATA_DIR/metrics/targets.json (file_sd)")
    up.add_argument("--gateway", action=argparse.BooleanOptionalAction, default=True,
                    help="run the public and internal Envoy gateways: the CLI and the printed address go "
                         "through the public one (localhost:GATEWAY_PORT, the same at each start), workers reach "
                         "the leading driver through the internal one; --no-gateway: people and workers reach "
                         "the services' own ports, new at each start (default: the gateways run)")
    up.add_argument("--gateway-port", type=_port, metavar="PORT",
                    help="with --gateway: the public gateway's port on 127.0.0.1 (0: a free one at each start) "
                         "(default: 8443)")
    up.add_argument("--internal-gateway-port", type=_port, metavar="PORT",
                    help="with --gateway: the internal gateway's (workers') port on 127.0.0.1 (0: a free one at "
                         "each start) (default: 8444)")
    for field, (kind, metavar, text) in GATEWAY_LIMITS.items():
        up.add_argument(f"--gateway-{field.removesuffix('_s').replace('_', '-')}", dest=f"gateway_{field}", type=kind,
                        metavar=metavar, help=f"with --gateway: {text}; docs/security.md")
    add_url_settings(up, None, "default: DATA_DIR/storage/{project}/")
    add_storage_access(up)
    add_worker_limits(up, "up-HASH, from the data directory's real path")
    up.add_argument("--worker-runtime", choices=("process", "oci", "auto"), default="auto",
                    help="how local workers run jobs: process (each as its own user in namespaces of its own), oci "
                         "(crun or runc containers of the job's image, pulled from the registry) or auto (oci where "
                         "this machine can run it, else process) (default: %(default)s)")
    up.add_argument("--unisolated-dev", action="store_true",
                    help="when not run as root, let workers run jobs unisolated as your own user instead of "
                         "refusing them (development only: a job can then read everything corral can)")
    up.add_argument("--restart-tries", type=int, default=5, metavar="N",
                    help="a process that dies is started again, at once, then after 1 s, 2 s, 4 s...; after N "
                         "restarts in a row that do not serve (ready, then up 2 s), stop everything and exit 1 "
                         "(default: %(default)s)")
    up.add_argument("--registry", metavar="URL", type=_registry_url,
                    help="corral's own registry, what image references name localhost/... (and, unless "
                         "--registry-mirror says otherwise, the mirror of docker.io under URL/docker.io): "
                         "http://HOST:PORT (plain HTTP) or https://HOST; default: a registry corral up runs on "
                         "loopback in DATA_DIR/registry, seeded with the base images (--base-images)")
    up.add_argument("--registry-port", type=_port, metavar="PORT",
                    help="the port on 127.0.0.1 of the registry corral up runs (not with --registry); kept in "
                         "DATA_DIR/registry/ports.json, so its address is the same at every start (default: the "
                         "port chosen at the first start)")
    add_registry_mirrors(up)
    up.add_argument("--base-images", metavar="NAMES", type=_base_images,
                    help="the base images to build (once, kept in DATA_DIR/registry/seed) and seed the registry "
                         "with, comma-separated, '' for none; the first start takes minutes for the Debian ones "
                         "(docs/images.md) (default: busybox,debian,python,openjdk)")
    up.add_argument("--base-image-cache", metavar="DIR", type=Path,
                    default=os.environ.get("CORRAL_BASE_IMAGE_CACHE") or None,
                    help="keep the built base images in DIR instead of DATA_DIR/registry/seed: every deployment "
                         "naming DIR shares them, so each is built once per machine (default: "
                         "$CORRAL_BASE_IMAGE_CACHE)")
    add_allowed_registries(up)
    up.add_argument("--prepull", action="append", default=[], metavar="[POOL=]IMAGE[,IMAGE...]",
                    help="images each worker (of POOL; without POOL=, of every pool) pulls when it starts, while it "
                         "takes jobs, so the first job of each starts without waiting for its pull; a failed pull "
                         "is logged, not fatal; repeatable (default: none)")
    up.add_argument("--provider", choices=("local", "gcp", "azure"), default="local",
                    help="who makes the workers' machines: local worker processes, or a cloud's machines (gcp, "
                         "azure), which enroll through the internal gateway (default: %(default)s)")
    up.add_argument("--provider-config", type=Path, metavar="FILE",
                    help="with --provider gcp or azure: the cloud's JSON configuration (docs/operations.md)")
    up.set_defaults(run=_up)
