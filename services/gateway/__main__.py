"""`python -m services.gateway [--deployment FILE] [--out DIR] [--check]`: regenerate the Envoy configs.

By default it reads envoy/local.yaml (the default local deployment) and
writes envoy/envoy-public.yaml and envoy/envoy-internal.yaml beside it.
With --check it writes nothing and fails when a checked-in config is not
what it would write. (The transcoder's descriptor set is not checked in:
whoever runs Envoy writes it with `services.gateway.descriptors.write_descriptor_set`.)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from services.gateway import write_configs
from services.gateway.deployment import Deployment

REPO = Path(__file__).resolve().parents[2]
LOCAL = REPO / "envoy" / "local.yaml"


def generate(deployment_file: Path, out: Path) -> list[Path]:
    """Every generated file for `deployment_file`, written into `out`."""
    return write_configs(Deployment.load(deployment_file), out, deployment_file.name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.gateway", description=__doc__.splitlines()[0])
    parser.add_argument("--deployment", type=Path, default=LOCAL, help="deployment description (YAML)")
    parser.add_argument("--out", type=Path, help="where to write (default: beside the description)")
    parser.add_argument("--check", action="store_true", help="only check that the files there are current")
    args = parser.parse_args(argv)
    out = args.out or args.deployment.parent
    if not args.check:
        for path in generate(args.deployment, out):
            print(path)
        return 0
    with tempfile.TemporaryDirectory() as scratch:
        stale = [p.name for p in generate(args.deployment, Path(scratch))
                 if not (out / p.name).exists() or (out / p.name).read_bytes() != p.read_bytes()]
    if stale:
        print(f"out of date in {out}: {', '.join(stale)} (run python -m services.gateway)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
