"""python -m services.driver [--database-url URL] --certs-dir DIR --spec-root-url URL --data-dir DIR
[--storage-root URL_TEMPLATE]... [--callback-allow-networks CIDR,...] [--secrets-key-file PEM]
[--provider gcp|azure --provider-config FILE --workers-enroll-address HOST:PORT] [--price-file FILE]
[--own-registry URL [--own-registry-login-file FILE]] [--registry-mirror REGISTRY=URL]...
[--allowed-registries HOST[:PORT],...]"""

import argparse
import asyncio
import logging
from pathlib import Path

from services.common import metrics
from services.common.entry import (
    OWN_REGISTRY_HELP,
    add_allowed_registries,
    add_registry_mirrors,
    add_database_url,
    add_url_settings,
    allowed_networks,
    allowed_registries,
    private_files,
)
from services.common.prepull import pool_images
from services.common.registry_logins import read_login_file
from services.common.registry_rules import RegistryRules
from services.common.storage_access import StorageAccess, add_arguments as add_storage_access
from services.common.worker_limits import WorkerLimits, add_arguments as add_worker_limits
from services.driver.app import DriverConfig, run
from services.driver.enrollment import EnrollmentSettings
from services.driver.leader import LeaseSettings
from services.driver.pricing import price_file
from services.driver.pricing.refresh import RefreshSettings
from services.driver.providers import cloud_setup
from services.driver.servicer import SessionSettings

parser = argparse.ArgumentParser(prog="python -m services.driver", description=__doc__)
add_database_url(parser)
parser.add_argument("--certs-dir", type=Path, required=True)
parser.add_argument("--spec-root-url", required=True)
parser.add_argument("--data-dir", type=Path, required=True)
parser.add_argument("--internal-address", default="127.0.0.1:0")
parser.add_argument("--driver-addresses", default="", help="every driver's address, comma-separated (for workers)")
parser.add_argument("--advertise-host", default="localhost",
                    help="the host name others reach this driver at, with its port: the leader's address "
                         "standbys and GetLeader name; its certificate must name it (default: %(default)s)")
parser.add_argument("--ports-file", type=Path)
parser.add_argument("--heartbeat-interval", type=float, default=SessionSettings.heartbeat_interval_s,
                    help="seconds between a worker's heartbeats (default: %(default)s)")
parser.add_argument("--heartbeat-timeout", type=float, default=SessionSettings.heartbeat_timeout_s,
                    help="seconds without a session or heartbeat before a worker is declared dead "
                         "(default: %(default)s)")
parser.add_argument("--leader-lease", type=float, default=LeaseSettings.lease_s,
                    help="seconds a renewal holds leadership; a standby takes over once it has run out, so it is "
                         "the failover time of a paused or cut-off leader (default: %(default)s)")
parser.add_argument("--leader-renew-interval", type=float, default=LeaseSettings.renew_s,
                    help="seconds between the leader's renewals and a standby's looks; at most half the lease "
                         "(default: %(default)s)")
parser.add_argument("--idle-timeout", type=float, default=SessionSettings.idle_timeout_s,
                    help="seconds a worker stays up with nothing to run (default: %(default)s)")
add_url_settings(parser, [], "none: jobs may name no files; workers check each job's files against them too")
add_storage_access(parser)  # for the local workers it starts
add_worker_limits(parser)  # for every worker it starts, local or a cloud's
parser.add_argument("--unisolated-dev-workers", action="store_true",
                    help="start local workers with --unisolated-dev (when not root, they run jobs unisolated "
                         "as their own user instead of refusing them; development only)")
parser.add_argument("--worker-runtime", choices=("process", "oci", "auto"), default="process",
                    help="how the local workers it starts run jobs (their --runtime; default: %(default)s)")
parser.add_argument("--own-registry", metavar="URL",
                    help=f"for the workers it starts: {OWN_REGISTRY_HELP} (default: none)")
parser.add_argument("--own-registry-login-file", type=Path, metavar="FILE",
                    help="the login local workers pull from the own registry with (a JSON file, 0600: "
                         "{\"username\": ..., \"password\": ...}); each gets a copy beside its certificate "
                         "(default: none, they pull anonymously)")
add_registry_mirrors(parser)  # for every worker it starts
add_allowed_registries(parser)
parser.add_argument("--prepull", action="append", default=[], metavar="[POOL=]IMAGE[,IMAGE...]",
                    help="images each local worker it starts (of POOL; without POOL=, of every pool) pulls into its "
                         "cache when it starts, while it takes jobs; repeatable (default: none)")
parser.add_argument("--worker-metrics-dir", type=Path, metavar="DIR",
                    help="local workers serve Prometheus metrics on a loopback port each, written to "
                         "DIR/worker-NAME.port (default: no worker metrics)")
parser.add_argument("--secrets-key-file", type=Path,
                    help="the private key that opens job secrets (PEM, X25519, 0600), to send them to the jobs' "
                         "workers; without it, jobs that mount secrets end in Error")
parser.add_argument("--enroll-address", metavar="HOST:PORT",
                    help="also listen here for workers without a certificate yet: TLS, no client certificate, "
                         "WorkerEnrollmentService alone (deployments without the internal gateway; default: none)")
parser.add_argument("--enroll-token-ttl", type=float, default=EnrollmentSettings.token_ttl_s, metavar="SECONDS",
                    help="an activation token enrolls only this long after its instance was created "
                         "(default: %(default)s)")
parser.add_argument("--worker-cert-validity", type=float, default=EnrollmentSettings.certificate_validity_s,
                    metavar="SECONDS", help="how long an enrolled worker's certificate is valid; it renews at two "
                                            "thirds of that (default: %(default)s)")
parser.add_argument("--local-workers-enroll", action="store_true",
                    help="local workers make their own key and enroll at --enroll-address with their one-time token, "
                         "as cloud workers do (default: the driver makes each local worker's key and certificate)")
parser.add_argument("--provider", choices=cloud_setup.PROVIDERS, default="local",
                    help="who makes the workers' machines: local (worker processes on this host), gcp (Compute "
                         "Engine) or azure (virtual machines) (default: %(default)s)")
parser.add_argument("--provider-config", type=Path, metavar="FILE",
                    help="with --provider gcp or azure: the cloud's JSON configuration (docs/operations.md)")
parser.add_argument("--workers-enroll-address", metavar="HOST:PORT",
                    help="with --provider gcp or azure: where the cloud's machines enroll with their one-time "
                         "token (the internal gateway's enrollment listener); --driver-addresses is where they "
                         "then reach the drivers")
parser.add_argument("--price-file", type=Path, metavar="FILE",
                    help="the prices of the deployment's machines until the cloud's price catalogue is read, and "
                         "the local provider's (default: the file shipped with corral; docs/operations.md)")
parser.add_argument("--price-refresh-interval", type=float, default=RefreshSettings.refresh_s, metavar="SECONDS",
                    help="how often the leader reads the cloud's price catalogue (default: %(default)s)")
parser.add_argument("--stopping-file", type=Path, metavar="FILE",
                    help="while FILE exists this driver starts no machine (corral up creates it when it begins to "
                         "stop, before it stops the workers; default: none)")
metrics.add_arguments(parser)
args = parser.parse_args()
if not 60 <= args.price_refresh_interval <= 7 * 86400:
    parser.error("--price-refresh-interval must be 60 s to a week")
if args.local_workers_enroll and not args.enroll_address:
    parser.error("--local-workers-enroll needs --enroll-address")
if args.enroll_token_ttl <= 0 or args.worker_cert_validity <= 0:
    parser.error("--enroll-token-ttl and --worker-cert-validity must be positive")
driver_addresses = tuple(filter(None, args.driver_addresses.split(",")))
storage_access = StorageAccess.from_args(args)
worker_limits = WorkerLimits.from_args(args)
if problems := worker_limits.problems():
    parser.error("; ".join(problems))
cloud = None
try:
    cloud_setup.check_flags(args.provider, args.provider_config, args.workers_enroll_address, driver_addresses,
                            [flag for flag, given in (("--local-workers-enroll", args.local_workers_enroll),
                                                      ("--unisolated-dev-workers", args.unisolated_dev_workers),
                                                      ("--worker-metrics-dir", args.worker_metrics_dir))
                             if given])
    if args.provider != "local":
        cloud = cloud_setup.load(args.provider, args.provider_config, cloud_setup.WorkerBootArgs(
            args.workers_enroll_address, driver_addresses, (args.certs_dir / "ca.pem").read_text(),
            cloud_setup.cloud_worker_args(args.spec_root_url, args.worker_runtime, storage_access.to_args(),
                                          args.own_registry, allowed_registries(args.allowed_registries),
                                          worker_limits.to_args(), args.registry_mirrors)))
    RegistryRules.of(args.own_registry, allowed_registries(args.allowed_registries), args.registry_mirrors)
    prepull = pool_images(args.prepull)
    if args.own_registry_login_file is not None:
        read_login_file(args.own_registry_login_file)  # a wrong or readable file stops the driver here
    price_file.load(args.price_file or price_file.SHIPPED)  # a wrong file stops the driver here, saying where
except (OSError, ValueError) as e:
    parser.error(str(e))
try:
    lease = LeaseSettings(args.leader_lease, args.leader_renew_interval)
except ValueError as e:
    parser.error(f"--leader-lease/--leader-renew-interval: {e}")
private_files()
metrics.serve_for_process(args, "driver")
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
asyncio.run(run(DriverConfig(args.database_url, args.certs_dir, args.spec_root_url, args.data_dir,
                             args.internal_address, advertise_host=args.advertise_host,
                             driver_addresses=driver_addresses,
                             ports_file=args.ports_file, unisolated_dev_workers=args.unisolated_dev_workers,
                             own_registry=args.own_registry, worker_runtime=args.worker_runtime,
                             own_registry_login_file=args.own_registry_login_file,
                             registry_mirrors=tuple(args.registry_mirrors),
                             allowed_registries=allowed_registries(args.allowed_registries),
                             session=SessionSettings(args.heartbeat_interval, args.heartbeat_timeout,
                                                     args.idle_timeout),
                             lease=lease,
                             storage_roots=tuple(args.storage_root),
                             storage_access=storage_access, worker_limits=worker_limits, cloud=cloud,
                             callback_allow_networks=allowed_networks(args.callback_allow_networks),
                             secrets_key_file=args.secrets_key_file, worker_metrics_dir=args.worker_metrics_dir,
                             enroll_address=args.enroll_address, local_workers_enroll=args.local_workers_enroll,
                             enrollment=EnrollmentSettings(args.enroll_token_ttl, args.worker_cert_validity),
                             price_file=args.price_file, prepull=prepull, stopping_file=args.stopping_file,
                             price_refresh=RefreshSettings(refresh_s=args.price_refresh_interval))))
