"""slurm-compare: corral beside Slurm, the same no-op work on the same machine, rounds alternating.

Every system asked for runs at once for the whole benchmark, each idle while another is timed:

  corral   `corral up` with local workers (as `bench e2e`: two workers of 16 cores per pool, a quarter
           core per job, so 128 jobs at once), one per runtime asked with `--runtime` (`process`, `oci`
           or both: bench/e2e.py's RUNTIMES), the Python client submitting a batch of N jobs of `true`
           and waiting for it to complete;
  Slurm    a private single-node Slurm on loopback per profile asked with `--slurm` (bench/slurm.py:
           `untuned`, the `defer` this comparison always had, and `tuned`, as Slurm's high-throughput
           guide advises; munged, slurmctld and slurmd from Debian's slurm-wlm, non-default ports, a
           node declaring 128 CPUs so 128 tasks run at once), `sbatch --array=1-N --wrap=true`, complete
           when its job-completion log holds every task.

Each round times, on each system in turn, one no-op batch of N and then a dependency chain of L jobs
(corral: each job the child of the one before; Slurm: `--dependency=afterok:` on the one before); the
order of the systems is reversed from one round to the next. Printed, as medians over the rounds: each
system's jobs/s and seconds per link, then corral's ratio to each Slurm profile for both (the median of
the rounds' ratios; issue 15's target: corral ≥ 10× Slurm's jobs/s).

Figure names: a system is `corral` (process runtime), `corral.oci`, `slurm` (untuned) or `slurm.tuned`;
a ratio is `ratio`, with `.oci` when corral's runtime is oci and `.tuned` when Slurm's profile is:
`slurm-compare.ratio.tuned.jobs_per_s` is corral (process) ÷ tuned Slurm. So the names the benchmark
had before the profiles (`corral`, `slurm`, `ratio`) still mean what they meant.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import statistics
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import corral
from bench.common import BenchContext, positive_int, progress
from bench.e2e import JOB_CORES, RUNTIMES, chain_batch, completed, corral_up, noop_batch, warm_up
from bench.slurm import PROFILES, SlurmCluster, profile_settings

NAME = "slurm-compare"
HELP = "corral and private Slurms (untuned, tuned), the same no-op batch and chain, rounds alternating"

DEFAULT_JOBS, SMOKE_JOBS = 2_000, 50
DEFAULT_CHAIN, SMOKE_CHAIN = 20, 3
DEFAULT_ROUNDS, SMOKE_ROUNDS = 3, 1
WORKER_CORES, MAX_WORKERS = 16, 2
SLOTS = int(MAX_WORKERS * WORKER_CORES / JOB_CORES)
"""Jobs that run at once on either system."""
TARGET_RATIO = 10.0
SHOWN_SETTINGS = sorted({name for profile in PROFILES for name in profile_settings(profile)})
"""What the results record of each Slurm's `scontrol show config`: every setting either profile sets."""


def comma_list(allowed: Sequence[str]) -> Callable[[str], tuple[str, ...]]:
    """An argparse type: a comma-separated list of ALLOWED values, each once, in the order given."""
    def parse(text: str) -> tuple[str, ...]:
        values = tuple(dict.fromkeys(value.strip() for value in text.split(",")))
        if not values or not set(values) <= set(allowed):
            raise argparse.ArgumentTypeError(f"{text!r}: a comma-separated list of {', '.join(allowed)}")
        return values
    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=positive_int, metavar="N",
                        help=f"no-op jobs per batch (default {DEFAULT_JOBS:,}; {SMOKE_JOBS} with --smoke)")
    parser.add_argument("--chain", type=positive_int, metavar="L",
                        help=f"links of each chain (default {DEFAULT_CHAIN}; {SMOKE_CHAIN} with --smoke)")
    parser.add_argument("--rounds", type=positive_int, metavar="R",
                        help=f"rounds, the order alternating (default {DEFAULT_ROUNDS}; {SMOKE_ROUNDS} with --smoke)")
    parser.add_argument("--runtime", type=comma_list(RUNTIMES), default=("process",), metavar="RUNTIMES",
                        help=f"corral's workers' runtimes, some of {','.join(RUNTIMES)}: a corral up each, "
                             "timed in the same rounds (default: process)")
    parser.add_argument("--slurm", type=comma_list(PROFILES), default=PROFILES, metavar="PROFILES",
                        help=f"Slurm's configurations, some of {','.join(PROFILES)} (bench/slurm.py): a cluster "
                             f"each, timed in the same rounds (default: {','.join(PROFILES)})")


def corral_label(runtime: str) -> str:
    return "corral" if runtime == "process" else f"corral.{runtime}"


def slurm_label(profile: str) -> str:
    return "slurm" if profile == "untuned" else f"slurm.{profile}"


def ratio_label(runtime: str, profile: str) -> str:
    return "ratio" + ("" if runtime == "process" else f".{runtime}") + ("" if profile == "untuned" else f".{profile}")


def figure_names(runtimes: Sequence[str] = ("process",), profiles: Sequence[str] = PROFILES) -> list[str]:
    """Every figure a run prints, in order: per figure, each corral, each Slurm, then each ratio."""
    return [f"{NAME}.{label}.{figure}" for figure in ("jobs_per_s", "s_per_link")
            for label in (*map(corral_label, runtimes), *map(slurm_label, profiles),
                          *(ratio_label(r, p) for r in runtimes for p in profiles))]


@dataclasses.dataclass(frozen=True)
class System:
    """One system under comparison: how long its no-op batch of N and its chain of L take, in seconds."""

    noop_s: Callable[[int], float]
    chain_s: Callable[[int], float]


def corral_system(client: corral.Client) -> System:
    def noop_s(n_jobs: int) -> float:
        return completed(client, noop_batch(n_jobs, "bench-slurm-compare-noop"), n_jobs, "corral job")[0]

    def chain_s(n_links: int) -> float:
        return completed(client, chain_batch(n_links, "bench-slurm-compare-chain"), n_links,
                         "link of corral's chain")[0]

    return System(noop_s, chain_s)


@dataclasses.dataclass
class Measured:
    times: dict[str, list[float]]
    """Seconds per round, by `SYSTEM.noop` and `SYSTEM.chain`."""
    orders: list[list[str]]
    """The systems in the order each round timed them."""
    slurm_shown: dict[str, dict[str, str]]
    """Per Slurm profile, SHOWN_SETTINGS as its `scontrol show config` showed them."""


def start_systems(stack: contextlib.ExitStack, ctx: BenchContext, work_dir: Path, runtimes: Sequence[str],
                  profiles: Sequence[str]) -> tuple[dict[str, System], dict[str, dict[str, str]]]:
    """Each Slurm and each corral up asked for, warmed up, all running until STACK closes; the systems
    by label, and what each Slurm's `scontrol show config` shows of SHOWN_SETTINGS."""
    systems, shown = {}, {}
    for profile in profiles:
        progress(f"{NAME}: starting Slurm, {profile} ({SLOTS} CPUs on one node), and running a first array")
        slurm = stack.enter_context(SlurmCluster.start(work_dir / f"slurm-{profile}", cpus=SLOTS, profile=profile))
        slurm.array_s(SLOTS)
        shown[profile] = {name: slurm.shown_config().get(name, "") for name in SHOWN_SETTINGS}
        systems[slurm_label(profile)] = System(slurm.array_s, slurm.chain_s)
    for runtime in runtimes:
        progress(f"{NAME}: starting corral up ({MAX_WORKERS} workers of {WORKER_CORES} cores, the {runtime} runtime)")
        # Its workers sit idle through the other systems' turns (minutes each): they must outlive them, or
        # the next turn would time the autoscaler starting them again.
        running = stack.enter_context(corral_up(ctx.server, work_dir / f"corral-{runtime}", runtime, WORKER_CORES,
                                                MAX_WORKERS, idle_timeout_s=3600))
        warm_up(running.client, MAX_WORKERS, WORKER_CORES, NAME)
        systems[corral_label(runtime)] = corral_system(running.client)
    return systems, shown


def first_order(runtimes: Sequence[str], profiles: Sequence[str]) -> list[str]:
    """The first round's order, corral and Slurm alternating (corral, slurm, corral.oci, slurm.tuned);
    each round after reverses the one before, so no system is always first or always after another."""
    corrals, slurms = [corral_label(r) for r in runtimes], [slurm_label(p) for p in profiles]
    return [label for i in range(max(len(corrals), len(slurms))) for label in (*corrals[i:i + 1], *slurms[i:i + 1])]


def measure(ctx: BenchContext, runtimes: Sequence[str], profiles: Sequence[str], n_jobs: int, n_links: int,
            n_rounds: int) -> Measured:
    """Start every system, time the rounds, stop them all (blocking: run in a thread)."""
    with tempfile.TemporaryDirectory(prefix="corral-bench-slurm-") as tmp, contextlib.ExitStack() as stack:
        systems, shown = start_systems(stack, ctx, Path(tmp), runtimes, profiles)
        labels = first_order(runtimes, profiles)
        times: dict[str, list[float]] = {f"{label}.{work}": [] for label in labels for work in ("noop", "chain")}
        orders = []
        for round_ in range(n_rounds):
            order = labels if round_ % 2 == 0 else labels[::-1]
            orders.append(order)
            for label in order:
                times[f"{label}.noop"].append(systems[label].noop_s(n_jobs))
                times[f"{label}.chain"].append(systems[label].chain_s(n_links))
                progress(f"{NAME}: round {round_ + 1}, {label}: {n_jobs / times[f'{label}.noop'][-1]:.1f} jobs/s, "
                         f"{times[f'{label}.chain'][-1] / n_links:.3f} s per link")
    return Measured(times, orders, shown)


async def run(ctx: BenchContext, args: argparse.Namespace) -> dict[str, Any]:
    n_jobs = args.jobs or (SMOKE_JOBS if ctx.smoke else DEFAULT_JOBS)
    n_links = args.chain or (SMOKE_CHAIN if ctx.smoke else DEFAULT_CHAIN)
    n_rounds = args.rounds or (SMOKE_ROUNDS if ctx.smoke else DEFAULT_ROUNDS)
    measured = await asyncio.to_thread(measure, ctx, args.runtime, args.slurm, n_jobs, n_links, n_rounds)
    times = measured.times
    rates = {label: [n_jobs / t for t in times[f"{label}.noop"]] for label in first_order(args.runtime, args.slurm)}
    links = {label: [t / n_links for t in times[f"{label}.chain"]] for label in rates}
    medians = {f"{NAME}.{label}.jobs_per_s": (round(statistics.median(rates[label]), 1), "jobs/s") for label in rates}
    medians |= {f"{NAME}.{label}.s_per_link": (round(statistics.median(links[label]), 4), "s") for label in links}
    for runtime in args.runtime:
        for profile in args.slurm:
            corral_, slurm_, ratio = corral_label(runtime), slurm_label(profile), ratio_label(runtime, profile)
            medians[f"{NAME}.{ratio}.jobs_per_s"] = (round(statistics.median(
                c / s for c, s in zip(rates[corral_], rates[slurm_])), 2), "x")
            # How many times faster corral's chain is: Slurm's seconds per link over corral's.
            medians[f"{NAME}.{ratio}.s_per_link"] = (round(statistics.median(
                s / c for c, s in zip(links[corral_], links[slurm_])), 2), "x")
    for name in figure_names(args.runtime, args.slurm):
        ctx.figures.add(name, *medians[name])
    return {
        "n_jobs": n_jobs,
        "n_links": n_links,
        "n_rounds": n_rounds,
        "slots": SLOTS,
        "rounds": {key: [round(t, 3) for t in values] for key, values in times.items()},
        "orders": measured.orders,
        "target_ratio_jobs_per_s": TARGET_RATIO,
        "corral": {corral_label(runtime): f"corral up, {MAX_WORKERS} local workers of {WORKER_CORES} cores, "
                                          f"{runtime} runtime, {JOB_CORES} core per job" for runtime in args.runtime},
        "slurm": {slurm_label(profile): f"Slurm {SlurmCluster.version()}, one node of {SLOTS} CPUs, the {profile} "
                                        "profile (bench/slurm.py), completion from jobcomp/filetxt"
                  for profile in args.slurm},
        "slurm_config": measured.slurm_shown,
        "smoke": ctx.smoke,
    }
