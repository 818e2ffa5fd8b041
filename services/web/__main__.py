"""python -m services.web --frontend-address HOST:PORT --auth-address HOST:PORT (--certs-dir DIR | --ca-cert PEM)
[--address HOST:PORT] [--ports-file FILE] [--login-source-token-file FILE] [--metrics-address HOST:PORT ...]"""

import argparse
import asyncio
import logging
from pathlib import Path

from services.common import metrics
from services.web.app import WebConfig, serve

parser = argparse.ArgumentParser(prog="python -m services.web", description=__doc__)
parser.add_argument("--address", default="127.0.0.1:0", help="where to listen (default %(default)s: a free port)")
parser.add_argument("--frontend-address", required=True, help="the frontend's public listener")
parser.add_argument("--auth-address", required=True, help="auth's public listener")
parser.add_argument("--certs-dir", type=Path,
                    help="its certificate (identity 'web') and the deployment CA: it serves TLS to callers with a "
                         "certificate of the CA (the gateway)")
parser.add_argument("--ca-cert", type=Path,
                    help="without --certs-dir: the CA of the frontend's and auth's certificates; it then serves "
                         "plain HTTP (tests only)")
parser.add_argument("--ports-file", type=Path)
parser.add_argument("--login-source-token-file", type=Path,
                    help="the secret with which auth believes the browser's address on a sign-in (the gateway's "
                         "token); without it sign-ins count against this service's address")
metrics.add_arguments(parser)
args = parser.parse_args()
if args.certs_dir is None and args.ca_cert is None:
    parser.error("--certs-dir or --ca-cert")
if args.metrics_address and args.certs_dir is None:
    parser.error("--metrics-address needs --certs-dir (the metrics port is TLS with the web's certificate)")
metrics.serve_for_process(args, "web")
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
asyncio.run(serve(WebConfig(args.address, args.frontend_address, args.auth_address, args.certs_dir,
                            ca_cert=args.ca_cert, ports_file=args.ports_file,
                            login_source_token_file=args.login_source_token_file)))
