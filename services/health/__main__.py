"""python -m services.health --address HOST:PORT --certs-dir DIR --identity NAME [--service NAME]

Asks a corral service's gRPC health (grpc.health.v1.Health/Check) over mutual TLS with the certificate in
DIR, and exits 0 when the answer is SERVING, 1 otherwise, saying why on stderr: a Kubernetes exec probe.
Kubernetes' own `grpc` probe speaks plain text, and every corral listener is TLS (the drivers' mutual TLS
only), so the probe runs inside the pod with the pod's own certificate. For the driver, ask for
`corral.driver.v1.DriverService`: only the leader serves it, so only the leader is ready.
"""

import argparse
import sys
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.tls import TlsFiles

parser = argparse.ArgumentParser(prog="python -m services.health", description=__doc__.splitlines()[0])
parser.add_argument("--address", required=True, help="HOST:PORT of the listener (in a pod: localhost:PORT)")
parser.add_argument("--certs-dir", type=Path, required=True, help="holds ca.pem, IDENTITY.pem and IDENTITY.key")
parser.add_argument("--identity", required=True, help="whose certificate to show (auth, frontend, driver, ...)")
parser.add_argument("--service", default="", help="the service to ask about (default: the whole server)")
parser.add_argument("--timeout-s", type=float, default=2.0, help="most seconds to wait for the answer")
args = parser.parse_args()
if not 0 < args.timeout_s <= 60:
    parser.error("--timeout-s must be above 0 and at most 60")
try:
    credentials = TlsFiles.of(args.certs_dir, args.identity).channel_credentials()
except FileNotFoundError as e:
    print(f"health: {e}", file=sys.stderr)
    sys.exit(1)
with grpc.secure_channel(args.address, credentials) as channel:
    try:
        answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=args.service),
                                                           timeout=args.timeout_s)
    except grpc.RpcError as e:
        print(f"health: {args.address} did not answer: {e.code().name} {e.details()}", file=sys.stderr)
        sys.exit(1)
status = health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)
if answer.status != health_pb2.HealthCheckResponse.SERVING:
    print(f"health: {args.address} {args.service or '(server)'}: {status}", file=sys.stderr)
    sys.exit(1)
