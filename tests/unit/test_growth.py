"""What faults/growth.py reads of a deployment's processes: the slope it calls growth, the names it gives,
and which processes it counts (those naming the data directory, not what runs below a worker)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from faults.growth import Series, deployment_processes, kind_of, name_of, reading, slope


@given(st.floats(-1e6, 1e6), st.integers(-10**9, 10**9), st.lists(st.floats(0, 3600), min_size=2, max_size=50,
                                                                   unique=True))
def test_the_slope_of_a_straight_line_is_its_rate(rate: float, start: int, times: list[float]) -> None:
    values = [round(start + rate * t) for t in times]
    assert abs(slope(times, values) - rate) <= 1e-6 * max(1.0, abs(rate)) + 1.0 / max(1e-9, max(times) - min(times))


@given(st.integers(0, 10**10), st.lists(st.floats(0, 3600), max_size=50))
def test_a_constant_does_not_grow(value: int, times: list[float]) -> None:
    assert slope(times, [value] * len(times)) == 0.0


def test_growth_is_read_over_the_second_half() -> None:
    """Warm-up (a pool filling in the first half) is not growth; a steady climb in the second half is."""
    mib = 1 << 20
    times = [float(t) for t in range(0, 3601, 60)]
    warming = Series("frontend", 1, times, [(50 + min(t, 1800) / 60) * mib for t in times], [10] * len(times))
    assert warming.rss_growth_mib_per_h() == 0.0
    leaking = Series("driver-0", 2, times, [(50 + t / 360) * mib for t in times], [10 + int(t // 600) for t in times])
    assert abs(leaking.rss_growth_mib_per_h() - 10.0) < 0.01
    assert 5.0 < leaking.fd_growth_per_h() < 7.0


def test_names() -> None:
    python = sys.executable
    worker = [python, "-m", "services.worker", "--instance-name", "standard-1a2b", "--x"]
    assert name_of(worker) == "worker standard-1a2b"
    assert kind_of("worker standard-1a2b") == "worker"
    assert name_of([python, "-m", "services.driver", "--ports-file", "/d/run/driver-1.ports"]) == "driver-1"
    assert kind_of("driver-1") == "driver-1"
    assert name_of([python, "-m", "corral.cli", "up", "--data-dir", "/d"]) == "corral up"
    assert name_of(["/usr/sbin/mariadbd", "--datadir=/d/mariadb"]) == "mariadbd"


def test_a_deployments_processes_are_those_naming_its_data_directory_but_not_below_a_worker(tmp_path: Path) -> None:
    data = tmp_path / "data"
    sleeper = "import sys, time; time.sleep(60)"
    spawner = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', "
               f"'{data}/job']); time.sleep(60)")
    children: list[int] = []
    processes = [subprocess.Popen([sys.executable, "-c", sleeper, "--ports-file", f"{data}/run/frontend.ports"]),
                 subprocess.Popen([sys.executable, "-c", spawner, "--instance-name", "w1", f"{data}/workers"]),
                 subprocess.Popen([sys.executable, "-c", sleeper, "--ports-file", f"{tmp_path}/other/x.ports"])]
    try:
        worker = processes[1].pid
        deadline = time.monotonic() + 30
        while True:  # until the worker's child runs
            found = deployment_processes(data, set())
            if len(found) == 3 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        children = [pid for pid in found if pid not in (p.pid for p in processes)]
        assert sorted(found.values()) == ["frontend", Path(sys.executable).name, "worker w1"]
        assert deployment_processes(data, {worker}) == {processes[0].pid: "frontend", worker: "worker w1"}
        read = reading(processes[0].pid)
        assert read is not None and read[0] > 0 and read[1] >= 3
    finally:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for process in processes:
            process.kill()
            process.wait()
