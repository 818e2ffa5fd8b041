"""pipeline-scatter: a scatter written with the pipeline library (corral.pipeline) through corral up.

N jobs, each reading one input file of its own and writing one output file, described with
`corral.pipeline` as a hailtop.batch script would be and submitted with its ServiceBackend to a `corral up`
(the process runtime, local storage) on a fresh schema of the runner's MariaDB. A one-job batch first brings
the workers up, so autoscaling is not timed. Figures (issue 37's acceptance 2): seconds to describe the
batch, seconds from `run()` to the submitted batch (compiling the specs, writing nothing but the specs:
inputs are already in storage) and to its completion, jobs/s over that, and the peak resident memory of this
process, the client. Every output is checked afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import BenchContext, positive_int, progress
from bench.e2e import fresh_schema
from services.up import process as up_process

NAME = "pipeline-scatter"
HELP = "a scatter of N jobs with one input and one output file each, written with corral.pipeline, on corral up"

DEFAULT_JOBS, SMOKE_JOBS = 10_000, 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=positive_int, metavar="N",
                        help=f"jobs of the scatter (default {DEFAULT_JOBS:,}; {SMOKE_JOBS} with --smoke)")


def figure_names(n_jobs: int) -> list[str]:
    """The names of every figure a run prints, in order."""
    return [f"{NAME}.{n_jobs}.{what}"
            for what in ("describe_seconds", "submit_seconds", "complete_seconds", "rate", "client_peak_rss")]


def measure(ctx: BenchContext, n_jobs: int) -> dict[str, float]:
    """Start corral up, run the scatter, check its outputs, stop it (blocking: run in a thread)."""
    import corral.pipeline as hb
    # The library says what it submitted on stdout, where a benchmark prints only its figures.
    with contextlib.redirect_stdout(sys.stderr), fresh_schema(ctx.server) as database_url, \
            tempfile.TemporaryDirectory(prefix="corral-bench-pipe-") as tmp:
        progress(f"{NAME}: starting corral up (the process runtime)")
        up = up_process.start(Path(tmp), "--database-url", database_url)
        os.environ["CORRAL_CONFIG"] = up.env["CORRAL_CONFIG"]
        try:
            storage = (up.data_dir / "storage" / "default").resolve()
            (storage / "inputs").mkdir(parents=True, exist_ok=True)
            for i in range(n_jobs):
                (storage / "inputs" / f"{i}.txt").write_text("x" * (i % 100) + "\n")
            with hb.ServiceBackend(billing_project="default", remote_tmpdir=f"file://{storage}/tmp") as backend:
                warm = hb.Batch(backend=backend, name="warm-up")
                warm.new_job().command("true")
                warm.run(disable_progress_bar=True)

                progress(f"{NAME}: describing {n_jobs:,} jobs")
                started = time.perf_counter()
                b = hb.Batch(backend=backend, name=f"bench-{NAME}-{n_jobs}")
                for i in range(n_jobs):
                    reads = b.read_input(f"file://{storage}/inputs/{i}.txt")
                    j = b.new_job(name=f"count-{i}").cpu("250m")
                    j.command(f"wc -c < {reads} > {j.ofile}")
                    b.write_output(j.ofile, f"file://{storage}/outputs/{i}.txt")
                described_s = time.perf_counter() - started

                progress(f"{NAME}: submitting and waiting")
                started = time.perf_counter()
                handle = b.run(wait=False, disable_progress_bar=True)
                submitted_s = time.perf_counter() - started
                status = handle.wait(disable_progress_bar=True)
                completed_s = time.perf_counter() - started
            peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            if status["n_succeeded"] != n_jobs:
                raise RuntimeError(f"not every job succeeded: {status}")
            wrong = [i for i in range(n_jobs)
                     if (storage / "outputs" / f"{i}.txt").read_text() != f"{i % 100 + 1}\n"]
            if wrong:
                raise RuntimeError(f"{len(wrong)} outputs are wrong, the first of job {wrong[0]}")
        finally:
            up.stop()
    return {"describe": described_s, "submit": submitted_s, "complete": completed_s, "rss": peak_rss_mib}


async def run(ctx: BenchContext, args: argparse.Namespace) -> dict[str, Any]:
    n_jobs = args.jobs or (SMOKE_JOBS if ctx.smoke else DEFAULT_JOBS)
    measured = await asyncio.to_thread(measure, ctx, n_jobs)
    describe, submit, complete, rate, rss = figure_names(n_jobs)
    ctx.figures.add(describe, round(measured["describe"], 2), "s")
    ctx.figures.add(submit, round(measured["submit"], 2), "s")
    ctx.figures.add(complete, round(measured["complete"], 2), "s")
    ctx.figures.add(rate, round(n_jobs / measured["complete"], 1), "jobs/s")
    ctx.figures.add(rss, round(measured["rss"]), "MiB")
    return {
        "n_jobs": n_jobs,
        "job": "wc -c of its input into its output (0.25 core), written with corral.pipeline",
        "services": "corral up, the process runtime, file:// storage",
        "smoke": ctx.smoke,
    }
