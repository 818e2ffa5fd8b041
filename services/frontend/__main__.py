"""python -m services.frontend [--database-url URL] --certs-dir DIR --auth-address HOST:PORT --spec-root-url URL
[--driver-addresses HOST:PORT,...] [--storage-root URL_TEMPLATE]... [--callback-allow-networks CIDR,...]
[--token-cache-s S] [--secrets-public-key-file PEM] [--own-registry URL] [--registry-mirror REGISTRY=URL]... [--allowed-registries HOST[:PORT],...]
[--own-registry-push URL --own-registry-push-login-file FILE] [--image-import-dir DIR] [--internal-pool-size N]
[--max-query-bytes N ...: every limit, see docs/security.md]"""

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
from services.common.registry_rules import RegistryRules
from services.frontend.app import FrontendConfig, run
from services.frontend.limits import Limits

parser = argparse.ArgumentParser(prog="python -m services.frontend", description=__doc__)
add_database_url(parser)
parser.add_argument("--certs-dir", type=Path, required=True)
parser.add_argument("--auth-address", required=True)
parser.add_argument("--spec-root-url", required=True)
parser.add_argument("--public-address", default="127.0.0.1:0")
parser.add_argument("--internal-address")
parser.add_argument("--ports-file", type=Path)
parser.add_argument("--driver-addresses", default="", help="comma-separated internal addresses of the drivers")
parser.add_argument("--token-cache-s", type=float, default=FrontendConfig.token_cache_s,
                    help="how long a verified token is trusted before auth is asked again: the longest a "
                         "revoked token keeps working here (default %(default)s)")
parser.add_argument("--secrets-public-key-file", type=Path,
                    help="the public key job secrets are sealed with (PEM, X25519; the drivers hold the private "
                         "key). Without it this deployment keeps no secrets")
parser.add_argument("--internal-pool-size", type=int, default=FrontendConfig.internal_pool_size,
                    help="database connections kept apart from the users' pool (whose size is pool_size= in "
                         "--database-url, 10 by default) for the health probe and internal calls "
                         "(default %(default)s)")
parser.add_argument("--reflect-also", default="", metavar="SERVICE,...",
                    help="services server reflection lists although another process serves them at the same "
                         "address (behind the gateway: corral.auth.v1.AuthService)")
add_url_settings(parser, [])
parser.add_argument("--own-registry", metavar="URL",
                    help=f"{OWN_REGISTRY_HELP}, as the workers are told: jobs may name it whatever its address "
                         "(default: none; localhost/... is refused)")
add_registry_mirrors(parser)  # the workers' mirrors: jobs may name them too, whatever their addresses
parser.add_argument("--own-registry-push", metavar="URL",
                    help="where this frontend writes into corral's own registry (http://HOST:PORT or https://HOST): "
                         "`corral images` imports projects' images there; needs --own-registry-push-login-file")
parser.add_argument("--own-registry-push-login-file", type=Path, metavar="FILE",
                    help="the push login of corral's own registry: a JSON file {\"username\": ..., \"password\": ...}, "
                         "readable by its owner only")
parser.add_argument("--image-import-dir", type=Path, metavar="DIR",
                    help="where image archives are held while they are imported (default: the system's temporary "
                         "directory); room for max_concurrent_image_imports archives")
add_allowed_registries(parser)
Limits.add_flags(parser)
metrics.add_arguments(parser)
args = parser.parse_args()
try:
    RegistryRules.of(args.own_registry, allowed_registries(args.allowed_registries), args.registry_mirrors)
except ValueError as e:
    parser.error(str(e))
if bool(args.own_registry_push) != bool(args.own_registry_push_login_file):
    parser.error("--own-registry-push and --own-registry-push-login-file go together")
if args.internal_pool_size < 1:
    parser.error("--internal-pool-size must be at least 1")
private_files()
metrics.serve_for_process(args, "frontend")
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
asyncio.run(run(FrontendConfig(args.database_url, args.certs_dir, args.auth_address, args.spec_root_url,
                               args.public_address, args.internal_address, ports_file=args.ports_file,
                               driver_addresses=tuple(a for a in args.driver_addresses.split(",") if a),
                               token_cache_s=args.token_cache_s, storage_roots=tuple(args.storage_root),
                               callback_allow_networks=allowed_networks(args.callback_allow_networks),
                               limits=Limits.from_args(args),
                               secrets_public_key_file=args.secrets_public_key_file,
                               own_registry=args.own_registry, registry_mirrors=tuple(args.registry_mirrors),
                               own_registry_push=args.own_registry_push,
                               own_registry_push_login_file=args.own_registry_push_login_file,
                               image_import_dir=args.image_import_dir,
                               allowed_registries=allowed_registries(args.allowed_registries),
                               reflect_also=tuple(s for s in args.reflect_also.split(",") if s),
                               internal_pool_size=args.internal_pool_size)))
