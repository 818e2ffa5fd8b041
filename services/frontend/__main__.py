"""python -m services.frontend --database-url URL --certs-dir DIR --auth-address HOST:PORT --spec-root-url URL
[--driver-addresses HOST:PORT,...] [--max-jobs-per-batch N ...: every limit, see docs/security.md]"""

import argparse
import asyncio
import logging
from pathlib import Path

from services.frontend.app import FrontendConfig, run
from services.frontend.limits import Limits

parser = argparse.ArgumentParser(prog="python -m services.frontend", description=__doc__)
parser.add_argument("--database-url", required=True)
parser.add_argument("--certs-dir", type=Path, required=True)
parser.add_argument("--auth-address", required=True)
parser.add_argument("--spec-root-url", required=True)
parser.add_argument("--public-address", default="127.0.0.1:0")
parser.add_argument("--internal-address")
parser.add_argument("--ports-file", type=Path)
parser.add_argument("--driver-addresses", default="", help="comma-separated internal addresses of the drivers")
Limits.add_flags(parser)
args = parser.parse_args()
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
asyncio.run(run(FrontendConfig(args.database_url, args.certs_dir, args.auth_address, args.spec_root_url,
                               args.public_address, args.internal_address, ports_file=args.ports_file,
                               driver_addresses=tuple(a for a in args.driver_addresses.split(",") if a),
                               limits=Limits.from_args(args))))
