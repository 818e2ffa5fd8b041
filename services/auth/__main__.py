"""python -m services.auth [--database-url URL] --certs-dir DIR [--ports-file F] [login limits]
[--token-cache-ttl-s S]"""

import argparse
import asyncio
import logging
from pathlib import Path

from services.auth.app import AuthConfig, run
from services.auth.login_limits import Backoff, LoginLimits
from services.auth.servicer import CACHE_TTL_S
from services.common import metrics
from services.common.entry import add_database_url, private_files

parser = argparse.ArgumentParser(prog="python -m services.auth", description=__doc__)
add_database_url(parser)
parser.add_argument("--certs-dir", type=Path, required=True)
parser.add_argument("--public-address", default="127.0.0.1:0")
parser.add_argument("--internal-address", default="127.0.0.1:0")
parser.add_argument("--ports-file", type=Path)
limits = LoginLimits()
parser.add_argument("--login-free-failures-per-user", type=int, default=limits.per_user.free_failures,
                    help="failed logins in a row for one username before delays start")
parser.add_argument("--login-max-delay-per-user-s", type=float, default=limits.per_user.max_delay_s)
parser.add_argument("--login-free-failures-per-source", type=int, default=limits.per_source.free_failures,
                    help="failed logins in a row from one address (IPv6: /64) before delays start")
parser.add_argument("--login-max-delay-per-source-s", type=float, default=limits.per_source.max_delay_s)
parser.add_argument("--token-cache-ttl-s", type=float, default=CACHE_TTL_S,
                    help="how long other services may reuse a verified token: with the frontend's "
                         "--token-cache-s, the longest a revoked token keeps working there (default %(default)s)")
parser.add_argument("--forwarded-for-header", help="trust this header for the caller's address "
                    "(only behind a gateway that sets it); default: the connection's peer")
parser.add_argument("--gateway-token-file", type=Path, metavar="FILE",
                    help="the secret the public gateway adds to the calls it forwards: on those, the caller's "
                         "address is the last entry of x-forwarded-for (default: none)")
metrics.add_arguments(parser)
args = parser.parse_args()
private_files()
metrics.serve_for_process(args, "auth")
login_limits = LoginLimits(  # a key is forgotten after 15 minutes' quiet, or its longest lock
    per_user=Backoff(args.login_free_failures_per_user, max_delay_s=args.login_max_delay_per_user_s,
                     forget_after_s=max(900.0, args.login_max_delay_per_user_s)),
    per_source=Backoff(args.login_free_failures_per_source, max_delay_s=args.login_max_delay_per_source_s,
                       forget_after_s=max(900.0, args.login_max_delay_per_source_s)))
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
asyncio.run(run(AuthConfig(args.database_url, args.certs_dir, args.public_address, args.internal_address,
                           ports_file=args.ports_file, login_limits=login_limits,
                           forwarded_for_header=args.forwarded_for_header,
                           gateway_token_file=args.gateway_token_file,
                           token_cache_ttl_s=args.token_cache_ttl_s)))
