"""How the CLI (`corral submit --estimate`) and the pipeline's dry run say a batch's estimate."""

from __future__ import annotations

from corral.batch.v1 import batch_service_pb2


def usd(micro_usd: int) -> str:
    """An amount of micro-USD in dollars, to the micro-dollar."""
    return f"${micro_usd / 1e6:,.6f}"


def estimate_lines(estimate: batch_service_pb2.EstimateBatchResponse, billing_project: str) -> list[str]:
    """What `corral submit --estimate` (and the pipeline's dry run) prints of an estimate."""
    jobs = f"{estimate.n_jobs:,} job{'s' if estimate.n_jobs != 1 else ''}"
    reserved = ("what its spending limit reserves" if estimate.limited
                else "the project has no spending limit, so nothing is reserved")
    return [f"estimate of {jobs} in billing project {billing_project} (nothing submitted):",
            f"  worst case: {usd(estimate.worst_case_micro_usd)} ({reserved}: each attempt for its timeout or "
            "the project's max job duration)",
            f"  expected:   {usd(estimate.expected_micro_usd)} ({estimate.n_jobs_from_history:,} priced from "
            f"history, {estimate.n_jobs_from_timeout:,} from timeout)"]
