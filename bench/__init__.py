"""corral's benchmarks: `python -m bench <name> [options]`.

Performance is measured here, by programs that print figures, never by
timed assertions in tests. Each benchmark is one module listed in
`BENCHMARKS` that provides `NAME`, `HELP`, `add_arguments(parser)` and
`async run(ctx, args)` (the `Benchmark` protocol in `bench/common.py`).
Adding one is a new module and one line in `BENCHMARKS`.

The runner adds the common options (`--database-url`, `--out`, `--smoke`),
provides the server (a private durable MariaDB unless told otherwise) and
writes `<out>/<NAME>.json`: figures, parameters, machine.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import cast

from bench.common import (
    DEFAULT_OUT_DIR, BenchContext, Benchmark, Figures, database_server, machine_info, progress, write_results,
)

# One line per benchmark module.
BENCHMARKS = (
    "bench.sj_mjc",
    "bench.submit",
    "bench.cancel",
    "bench.fanout",
    "bench.fair_share",
    "bench.driver_memory",
    "bench.e2e",
    "bench.pipeline_scatter",
    "bench.slurm_compare",
    "bench.query_limits",
    "bench.supervise",
    "bench.job_start",
    "bench.failover",
    "bench.fuzz_query",
    "bench.warm_image",
    "bench.web_drawing",
    "bench.web",
)


def _parser(modules: Sequence[Benchmark]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="bench", required=True, metavar="BENCHMARK")
    for module in modules:
        sub = commands.add_parser(module.NAME, help=module.HELP, description=module.__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
        sub.add_argument("--database-url", metavar="URL",
                         help="an existing server (mysql://user:pw@host:port/any or "
                              "mysql://root@localhost/any?unix_socket=PATH); the benchmark creates and drops "
                              "its own schemas there. Default: a private MariaDB with durable settings, "
                              "stopped at the end")
        sub.add_argument("--out", type=Path, default=DEFAULT_OUT_DIR, metavar="DIR",
                         help="where results go (default: bench/results/, git-ignored)")
        sub.add_argument("--smoke", action="store_true", help="tiny sizes: check that it works, in seconds")
        module.add_arguments(sub)
    return parser


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line, run one benchmark, write its results."""
    modules = [cast(Benchmark, importlib.import_module(name)) for name in BENCHMARKS]
    args = _parser(modules).parse_args(argv)
    module = next(m for m in modules if m.NAME == args.bench)
    # SIGTERM takes the Ctrl-C path, so the private server is stopped too.
    signal.signal(signal.SIGTERM, _interrupt)
    args.out.mkdir(parents=True, exist_ok=True)
    figures = Figures()
    try:
        with database_server(args.database_url) as server:
            ctx = BenchContext(server=server, out_dir=args.out, smoke=args.smoke, figures=figures)
            parameters = asyncio.run(module.run(ctx, args))
            path = write_results(args.out, module.NAME, figures, parameters, machine_info(server))
    except KeyboardInterrupt:
        progress("interrupted")
        return 130
    progress(f"results written to {path}")
    return 0
