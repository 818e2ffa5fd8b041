"""bench/slurm.py's profiles ask only for scheduler options the installed Slurm knows: slurmctld looks
each SchedulerParameters option up by name and ignores the others, so a misspelt one would leave
Slurm's default in place and still start."""

from __future__ import annotations

import shutil

import pytest

from bench.slurm import PROFILES, documented_scheduler_options, profile_settings, undocumented_scheduler_options

pytestmark = pytest.mark.skipif(shutil.which("slurmctld") is None, reason="Slurm is not installed")


@pytest.mark.parametrize("profile", PROFILES)
def test_every_scheduler_option_is_documented(profile: str) -> None:
    assert undocumented_scheduler_options(profile_settings(profile)) == set()


def test_a_misspelt_option_is_caught() -> None:
    assert {"defer", "batch_sched_delay", "sched_min_interval", "default_queue_depth"} <= documented_scheduler_options()
    assert undocumented_scheduler_options({"SchedulerParameters": "defer,batch_sched_dely=0"}) == {"batch_sched_dely"}


def test_an_unknown_profile_is_refused() -> None:
    with pytest.raises(ValueError, match="no Slurm profile 'fast': one of untuned, tuned"):
        profile_settings("fast")
