"""bench/cpu.py: how a phase's CPU is split into groups, on made-up process tables."""

from __future__ import annotations

import pytest

from bench.cpu import CpuSnapshot, Times, _tree_s, cpu_ms_per_job


def test_a_tree_counts_what_was_waited_for_and_every_live_descendant() -> None:
    # worker 10 -> launcher 11 -> attempts 12, 13 -> 14; 20 is someone else's
    processes = {10: (1, 5.0, 0.5), 11: (10, 1.0, 2.0), 12: (11, 0.25, 0.0), 13: (11, 0.5, 0.25),
                 14: (13, 0.125, 0.0), 20: (1, 100.0, 100.0)}
    assert _tree_s(10, processes) == 0.5 + (1.0 + 2.0) + 0.25 + (0.5 + 0.25) + 0.125
    assert _tree_s(14, processes) == 0.0


def test_groups_per_job_the_busier_driver_leads_and_workers_trees_count_apart() -> None:
    before = CpuSnapshot({("database", 1): Times(10.0, 0.0), ("driver-0", 2): Times(3.0, 9.0),
                          ("driver-1", 3): Times(1.0, 0.0), ("frontend", 4): Times(2.0, 0.0),
                          ("worker-a", 5): Times(1.0, 1.0), ("auth", 6): Times(1.0, 0.0)})
    after = CpuSnapshot({("database", 1): Times(12.0, 0.0), ("driver-0", 2): Times(3.5, 50.0),
                         ("driver-1", 3): Times(2.0, 0.0), ("frontend", 4): Times(2.5, 0.0),
                         ("worker-a", 5): Times(2.0, 4.0), ("worker-b", 7): Times(0.5, 1.0)})
    use = cpu_ms_per_job(before, after, n_jobs=1000)
    assert use.ms_per_job["database"] == 2.0
    # driver-1 used more in the phase: it led. A driver's children (workers it started) are not its own.
    assert (use.ms_per_job["driver_leader"], use.ms_per_job["driver_standby"]) == (1.0, 0.5)
    assert use.ms_per_job["frontend"] == 0.5
    # worker-b started during the phase and counts whole.
    assert (use.ms_per_job["workers"], use.ms_per_job["workers_children"]) == (1.5, 4.0)
    assert use.lost == ["auth (pid 6)"] and use.ms_per_job["auth"] == 0.0
    assert use.control_plane_ms_per_job == pytest.approx(2.0 + 1.0 + 0.5 + 0.5)
