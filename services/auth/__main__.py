"""python -m services.auth [--database-url URL] --certs-dir DIR [--ports-file F]"""

import argparse
import asyncio
import logging
from pathlib import Path

from services.auth.app import AuthConfig, run
from services.common.entry import add_database_url, private_files

parser = argparse.ArgumentParser(prog="python -m services.auth", description=__doc__)
add_database_url(parser)
parser.add_argument("--certs-dir", type=Path, required=True)
parser.add_argument("--public-address", default="127.0.0.1:0")
parser.add_argument("--internal-address", default="127.0.0.1:0")
parser.add_argument("--ports-file", type=Path)
args = parser.parse_args()
private_files()
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
asyncio.run(run(AuthConfig(args.database_url, args.certs_dir, args.public_address, args.internal_address,
                           ports_file=args.ports_file)))
