"""The benchmarks run: `python -m bench NAME --smoke` against the test
session's server prints every figure, writes its JSON (and plot, where it
draws one), and leaves no schema behind. Nothing here looks at speed:
figures are for people."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pymysql

import pytest

from bench import (cancel, driver_memory, e2e, failover, fair_share, fanout, fuzz_query, job_start, oci_start,
                   pipeline_scatter, query_limits, sj_mjc, slurm_compare, submit, supervise, warm_image, web,
                   web_drawing)
from bench.common import SCHEMA_PREFIX
from services.db.database import DatabaseConfig
from services.worker.runtime import can_isolate

REPO_DIR = Path(__file__).resolve().parents[2]
# `name: value unit`, the value a plain number.
SUMMARY_LINE = re.compile(r"^(?P<name>\S+): (?P<value>-?\d+(?:\.\d+)?) (?P<unit>\S+)$")


def database_url(config: DatabaseConfig) -> str:
    """A --database-url for the session's server; the schema name is ignored."""
    credentials = quote(config.user, safe="") + (f":{quote(config.password, safe='')}" if config.password else "")
    if config.unix_socket:
        return f"mysql://{credentials}@localhost/ignored?unix_socket={quote(config.unix_socket)}"
    return f"mysql://{credentials}@{config.host}:{config.port}/ignored"


def bench_schemas(config: DatabaseConfig) -> set[str]:
    conn = pymysql.connect(**config.connect_kwargs(with_database=False))
    try:
        with conn.cursor() as cursor:
            cursor.execute("SHOW DATABASES")
            return {name for (name,) in cursor.fetchall() if name.startswith(SCHEMA_PREFIX)}
    finally:
        conn.close()


def run_bench(server: DatabaseConfig, out: Path, name: str, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench", name, "--smoke", "--database-url", database_url(server), "--out", str(out),
         *options],
        cwd=REPO_DIR, capture_output=True, text=True, timeout=240,
    )


def summary(stdout: str) -> dict[str, tuple[float, str]]:
    """Every line of stdout as name -> (value, unit); each must be a summary line."""
    printed = {}
    for line in stdout.splitlines():
        match = SUMMARY_LINE.match(line)
        assert match, f"not a summary line: {line!r}"
        printed[match["name"]] = (float(match["value"]), match["unit"])
    return printed


def results_of(out: Path, name: str, printed: dict[str, tuple[float, str]]) -> dict[str, Any]:
    """The JSON results file, checked against what was printed."""
    results = json.loads((out / f"{name}.json").read_text())
    assert results["bench"] == name
    assert {n: (f["value"], f["unit"]) for n, f in results["figures"].items()} == printed
    assert {"cpu_count", "platform", "server_version", "git_commit", "timestamp"} <= set(results["machine"])
    assert results["parameters"]["smoke"] is True
    return results


def is_png(path: Path) -> bool:
    return path.read_bytes().startswith(b"\x89PNG")


def test_sj_mjc_smoke(mariadb_server: DatabaseConfig, tmp_path: Path) -> None:
    before = bench_schemas(mariadb_server)
    result = run_bench(mariadb_server, tmp_path, "sj-mjc")
    assert result.returncode == 0, result.stderr

    printed = summary(result.stdout)
    expected = sj_mjc.figure_names(smoke=True)
    assert list(printed) == expected
    assert {"sj-mjc.sj+mjc.best", "sj-mjc.full.best", "sj-mjc.full.32conn.retries"} <= set(printed)
    units = {"retries": "retries", "statements_per_job": "statements", "database_cpu_ms_per_job": "ms"}
    for name, (value, unit) in printed.items():
        assert unit == units.get(name.rsplit(".", 1)[1], "jobs/s"), name
        assert value >= 0
    results = results_of(tmp_path, "sj-mjc", printed)
    runs = results["parameters"]["runs"]
    for run in runs:  # each call is a statement, and runs more inside
        assert run["statements"] > 2 * run["n_jobs"] / run["jobs_per_call"], run
    assert sum(run["database_cpu_s"] for run in runs) > 0  # the server's pid was read (10 ms ticks)
    assert results["parameters"]["n_jobs_per_run"] == sj_mjc.SMOKE_JOBS
    assert is_png(tmp_path / "sj-mjc.png")

    assert bench_schemas(mariadb_server) == before


def test_submit_smoke(mariadb_server: DatabaseConfig, tmp_path: Path) -> None:
    before = bench_schemas(mariadb_server)
    result = run_bench(mariadb_server, tmp_path, "submit")
    assert result.returncode == 0, result.stderr

    printed = summary(result.stdout)
    assert list(printed) == submit.figure_names(submit.SMOKE_JOBS)
    rate, seconds, add_jobs, commit, client_rss = (printed[n] for n in submit.figure_names(submit.SMOKE_JOBS))
    assert client_rss[1] == "MiB" and client_rss[0] > 0
    assert rate[1] == "jobs/s" and rate[0] > 0
    assert {seconds[1], add_jobs[1], commit[1]} == {"s"}
    assert seconds[0] > 0 and add_jobs[0] >= 0 and commit[0] >= 0

    results = results_of(tmp_path, "submit", printed)
    assert results["parameters"]["n_jobs"] == submit.SMOKE_JOBS
    assert bench_schemas(mariadb_server) == before


def test_cancel_smoke(mariadb_server: DatabaseConfig, tmp_path: Path) -> None:
    before = bench_schemas(mariadb_server)
    result = run_bench(mariadb_server, tmp_path, "cancel", "--max-jobs", "100", "--samples", "3")
    assert result.returncode == 0, result.stderr

    printed = summary(result.stdout)
    assert list(printed) == cancel.figure_names([100])
    assert printed["cancel.100.p50"][1] == printed["cancel.100.p99"][1] == "ms"
    assert 0 < printed["cancel.100.p50"][0] <= printed["cancel.100.p99"][0]
    assert printed["cancel.100.drain"][1] == "jobs/s" and printed["cancel.100.drain"][0] > 0

    results = results_of(tmp_path, "cancel", printed)
    assert results["parameters"]["sizes"] == [100]
    assert results["parameters"]["samples_per_size"] == 3
    assert is_png(tmp_path / "cancel.png")
    assert bench_schemas(mariadb_server) == before


def test_cancel_refuses_a_limit_below_every_size(mariadb_server: DatabaseConfig, tmp_path: Path) -> None:
    result = run_bench(mariadb_server, tmp_path, "cancel", "--max-jobs", "10")
    assert result.returncode != 0
    assert "no batch size is at most --max-jobs 10" in result.stderr
    assert result.stdout == ""
    assert not (tmp_path / "cancel.json").exists()


def check_fanout(printed: dict[str, tuple[float, str]]) -> None:
    assert list(printed) in (fanout.figure_names(with_memory=True), fanout.figure_names(with_memory=False))
    units = {"mjc_ms": "ms", "jobs_per_s": "jobs/s", "settle_s": "s", "db_peak_mb": "MB"}
    for name, (value, unit) in printed.items():
        assert unit == units[name.rsplit(".", 1)[1]], name
        assert value > 0 if unit != "s" else value >= 0, name


def test_fanout_smoke(mariadb_server: DatabaseConfig, tmp_path: Path) -> None:
    before = bench_schemas(mariadb_server)
    # Small chunks, so the inline release, the releaser's chunks and the
    # canceller's pending pass each take several turns.
    result = run_bench(mariadb_server, tmp_path, "fanout", "--children", "600", "--inline", "100",
                       "--release-chunk", "150", "--pending-chunk", "200")
    assert result.returncode == 0, result.stderr
    printed = summary(result.stdout)
    check_fanout(printed)
    # The test session's server runs as this user: its memory is readable.
    assert "fanout.release.db_peak_mb" in printed
    results = results_of(tmp_path, "fanout", printed)
    assert (results["parameters"]["n_children"], results["parameters"]["release_chunk"]) == (600, 150)
    assert bench_schemas(mariadb_server) == before


@pytest.mark.slow
def test_fanout_of_a_million_children(mariadb_server: DatabaseConfig, tmp_path: Path) -> None:
    """The issue's size: a parent of 1,000,000 children released, cancelled and failed.
    Takes about ten minutes; it asserts that it works, the figures are for people."""
    result = subprocess.run(
        [sys.executable, "-m", "bench", "fanout", "--children", "1000000", "--database-url",
         database_url(mariadb_server), "--out", str(tmp_path)],
        cwd=REPO_DIR, capture_output=True, text=True, timeout=3600,
    )
    assert result.returncode == 0, result.stderr
    check_fanout(summary(result.stdout))


def test_fair_share_smoke(mariadb_server: DatabaseConfig, tmp_path: Path) -> None:
    before = bench_schemas(mariadb_server)
    result = run_bench(mariadb_server, tmp_path, "fair-share")
    assert result.returncode == 0, result.stderr

    printed = summary(result.stdout)
    assert list(printed) == fair_share.figure_names()
    assert {unit for _, unit in printed.values()} == {"ms"}
    for part in ("total", "query", "compute"):
        assert 0 < printed[f"fair-share.{part}.p50"][0] <= printed[f"fair-share.{part}.p99"][0]

    results = results_of(tmp_path, "fair-share", printed)
    assert results["parameters"]["users"] == fair_share.SMOKE_USERS
    assert results["parameters"]["running_batches_per_user"] == fair_share.SMOKE_BATCHES_PER_USER
    assert bench_schemas(mariadb_server) == before


def test_driver_memory_smoke(mariadb_server: DatabaseConfig, tmp_path: Path) -> None:
    before = bench_schemas(mariadb_server)
    result = run_bench(mariadb_server, tmp_path, "driver-memory", "--seconds", "1")
    assert result.returncode == 0, result.stderr

    printed = summary(result.stdout)
    assert list(printed) == driver_memory.figure_names()
    assert {unit for _, unit in printed.values()} == {"MB"}
    # A Python process with grpc and aiomysql loaded is tens of MB, whatever the speed.
    assert all(value > 10 for value, _ in printed.values())

    results = results_of(tmp_path, "driver-memory", printed)
    assert results["parameters"]["n_ready_jobs"] == driver_memory.SMOKE_JOBS
    assert results["parameters"]["failed_cycles"] == {"empty": 0, "queued": 0}
    assert is_png(tmp_path / "driver-memory.png")
    for label in ("empty", "queued"):
        assert " leads with epoch " in (tmp_path / f"driver-memory-{label}.log").read_text()
    assert bench_schemas(mariadb_server) == before


def test_e2e_fleet_smoke(mariadb_server: DatabaseConfig, tmp_path: Path) -> None:
    """Simulated workers: the real worker process and session, a runtime that forks nothing."""
    result = run_bench(mariadb_server, tmp_path, "e2e", "--fleet", "2", "--worker-cores", "4")
    assert result.returncode == 0, result.stderr

    printed = summary(result.stdout)
    assert list(printed) == e2e.figure_names("fleet")
    # The control plane did the same work as with real workers; the workers forked nothing per job.
    for group in ("database", "driver_leader", "frontend", "workers", "control_plane"):
        assert printed[f"e2e.fleet.noop.cpu_ms_per_job.{group}"][0] > 0, group
    assert printed["e2e.fleet.noop.cpu_ms_per_job.workers_children"][0] == 0
    results = results_of(tmp_path, "e2e", printed)
    assert results["parameters"]["fleet"] == 2
    assert results["parameters"]["cpu_processes_lost"] == []
    assert is_png(tmp_path / "e2e-fleet.png")


def test_slurm_compare_smoke(mariadb_server: DatabaseConfig, tmp_path: Path) -> None:
    """corral and two private Slurms on loopback, untuned and tuned, the same work: all finish, each Slurm
    runs with its profile's settings, and the ratios are theirs."""
    before = bench_schemas(mariadb_server)
    result = run_bench(mariadb_server, tmp_path, "slurm-compare")
    assert result.returncode == 0, result.stderr

    printed = summary(result.stdout)
    assert list(printed) == slurm_compare.figure_names() == [
        f"slurm-compare.{system}.{figure}" for figure in ("jobs_per_s", "s_per_link")
        for system in ("corral", "slurm", "slurm.tuned", "ratio", "ratio.tuned")]
    assert all(value > 0 for value, _ in printed.values())
    for profile in ("", ".tuned"):
        value = {name.removeprefix("slurm-compare."): v for name, (v, _) in printed.items()}
        assert value[f"ratio{profile}.jobs_per_s"] == pytest.approx(
            value["corral.jobs_per_s"] / value[f"slurm{profile}.jobs_per_s"], rel=0.02)
        assert value[f"ratio{profile}.s_per_link"] == pytest.approx(
            value[f"slurm{profile}.s_per_link"] / value["corral.s_per_link"], rel=0.02)
    results = results_of(tmp_path, "slurm-compare", printed)
    parameters = results["parameters"]
    assert {key: len(times) for key, times in parameters["rounds"].items()} == {
        f"{system}.{work}": 1 for system in ("corral", "slurm", "slurm.tuned") for work in ("noop", "chain")}
    assert parameters["orders"] == [["corral", "slurm", "slurm.tuned"]]
    # What each slurmctld said it runs with (`scontrol show config`): today's settings and the guide's.
    assert parameters["slurm_config"] == {
        "untuned": {"SchedulerType": "sched/builtin", "SchedulerParameters": "defer",
                    "PriorityType": "priority/basic", "SlurmctldDebug": "info", "SlurmdDebug": "info",
                    "MessageTimeout": "10 sec"},
        "tuned": {"SchedulerType": "sched/builtin",
                  "SchedulerParameters": "defer,batch_sched_delay=0,sched_min_interval=0,default_queue_depth=1000",
                  "PriorityType": "priority/basic", "SlurmctldDebug": "error", "SlurmdDebug": "error",
                  "MessageTimeout": "30 sec"}}
    assert bench_schemas(mariadb_server) == before
    # Each munged (socket in /tmp/corral-munge-*) is stopped, with its slurmctld and slurmd before it.
    leftovers = subprocess.run(["pgrep", "-af", "munged .*corral-munge-"], capture_output=True, text=True).stdout
    assert leftovers == "", f"the benchmark's munged is still running: {leftovers}"


def test_slurm_compare_both_runtimes_smoke(mariadb_server: DatabaseConfig, tmp_path: Path) -> None:
    """corral with processes and with containers in the same rounds as one Slurm, alternating."""
    if why_not := oci_start.why_not():
        pytest.skip(f"no OCI runtime here: {why_not}")
    result = run_bench(mariadb_server, tmp_path, "slurm-compare", "--runtime", "process,oci", "--slurm", "tuned",
                       "--jobs", "20", "--rounds", "2")
    assert result.returncode == 0, result.stderr

    printed = summary(result.stdout)
    assert list(printed) == slurm_compare.figure_names(("process", "oci"), ("tuned",)) == [
        f"slurm-compare.{system}.{figure}" for figure in ("jobs_per_s", "s_per_link")
        for system in ("corral", "corral.oci", "slurm.tuned", "ratio.tuned", "ratio.oci.tuned")]
    assert all(value > 0 for value, _ in printed.values())
    parameters = results_of(tmp_path, "slurm-compare", printed)["parameters"]
    assert parameters["orders"] == [["corral", "slurm.tuned", "corral.oci"], ["corral.oci", "slurm.tuned", "corral"]]
    assert set(parameters["slurm_config"]) == {"tuned"}


def test_slurm_compare_refuses_unknown_choices(tmp_path: Path) -> None:
    for option, value in (("--runtime", "process,docker"), ("--slurm", "untuned,fast"), ("--slurm", "")):
        refused = subprocess.run([sys.executable, "-m", "bench", "slurm-compare", option, value, "--out",
                                  str(tmp_path)], cwd=REPO_DIR, capture_output=True, text=True, timeout=60)
        assert refused.returncode == 2, (option, value)
        assert "a comma-separated list of" in refused.stderr, refused.stderr
    assert not list(tmp_path.iterdir())


def test_e2e_smoke(mariadb_server: DatabaseConfig, tmp_path: Path) -> None:
    before = bench_schemas(mariadb_server)
    result = run_bench(mariadb_server, tmp_path, "e2e", "--max-workers", "1")
    assert result.returncode == 0, result.stderr

    printed = summary(result.stdout)
    assert list(printed) == e2e.figure_names()
    units = {name: unit for name, (_, unit) in printed.items()}
    cpu = e2e.cpu_figure_names()
    assert units == {"e2e.noop.jobs_per_s": "jobs/s", "e2e.noop.ready_to_running.p50": "ms",
                     "e2e.noop.ready_to_running.p99": "ms", "e2e.noop.running_to_complete.p50": "ms",
                     "e2e.noop.running_to_complete.p99": "ms", "e2e.chain.s_per_link": "s",
                     **{name: "ms" for name in cpu[:-2]}, **{name: "statements" for name in cpu[-2:]}}
    assert all(value > 0 for name, (value, _) in printed.items() if name not in cpu)
    assert printed["e2e.noop.ready_to_running.p50"][0] <= printed["e2e.noop.ready_to_running.p99"][0]
    # Every job costs the database, the leading driver, the frontend and a worker something; the jobs
    # themselves are the workers' children. No gateway runs (the benchmark calls the services directly).
    for group in ("database", "driver_leader", "frontend", "workers", "workers_children", "control_plane"):
        assert printed[f"e2e.noop.cpu_ms_per_job.{group}"][0] > 0, group
    # A job is several calls, each several statements.
    assert 1 < printed["e2e.noop.db_round_trips_per_job"][0] < printed["e2e.noop.db_statements_per_job"][0]
    assert printed["e2e.noop.cpu_ms_per_job.gateways"][0] == 0
    parts = ("database", "driver_leader", "driver_standby", "frontend", "auth", "gateways")
    assert printed["e2e.noop.cpu_ms_per_job.control_plane"][0] == pytest.approx(
        sum(printed[f"e2e.noop.cpu_ms_per_job.{p}"][0] for p in parts), abs=0.01)

    results = results_of(tmp_path, "e2e", printed)
    assert (results["parameters"]["n_jobs"], results["parameters"]["n_links"]) == (e2e.SMOKE_JOBS, e2e.SMOKE_CHAIN)
    assert is_png(tmp_path / "e2e.png")
    assert bench_schemas(mariadb_server) == before


def test_e2e_oci_smoke(mariadb_server: DatabaseConfig, tmp_path: Path) -> None:
    """The same workloads in containers: corral up's registry, runc."""
    if why_not := oci_start.why_not():
        pytest.skip(f"no OCI runtime here: {why_not}")
    before = bench_schemas(mariadb_server)
    result = run_bench(mariadb_server, tmp_path, "e2e", "--runtime", "oci", "--max-workers", "1", "--worker-cores",
                       "4", "--jobs", "20", "--chain", "3")
    assert result.returncode == 0, result.stderr

    printed = summary(result.stdout)
    assert list(printed) == e2e.figure_names("oci")
    assert all(name.startswith("e2e.oci.") for name in printed)
    assert all(value > 0 for name, (value, _) in printed.items() if name not in e2e.cpu_figure_names("oci"))
    assert printed["e2e.oci.noop.cpu_ms_per_job.workers_children"][0] > 0  # keepers, runc, the containers
    results = results_of(tmp_path, "e2e", printed)
    assert results["parameters"]["runtime"] == "oci"
    assert is_png(tmp_path / "e2e-oci.png")
    assert bench_schemas(mariadb_server) == before


def test_warm_image_smoke(mariadb_server: DatabaseConfig, tmp_path: Path) -> None:
    """A first and a second job of a new image (a small random layer) on one warm worker, in containers."""
    if why_not := oci_start.why_not():
        pytest.skip(f"no OCI runtime here: {why_not}")
    before = bench_schemas(mariadb_server)
    result = run_bench(mariadb_server, tmp_path, "warm-image")
    assert result.returncode == 0, result.stderr

    printed = summary(result.stdout)
    assert list(printed) == warm_image.figure_names()
    assert all(value > 0 for value, _ in printed.values())
    for phase in warm_image.PHASES:  # each job ends after it starts
        assert printed[f"warm-image.{phase}.submit_to_end_s"][0] >= printed[f"warm-image.{phase}.submit_to_start_s"][0]
    results = results_of(tmp_path, "warm-image", printed)
    assert results["parameters"]["layer_mib"] == warm_image.SMOKE_LAYER_MIB
    assert results["parameters"]["digest"].startswith("sha256:")
    assert bench_schemas(mariadb_server) == before


def test_query_limits_smoke(mariadb_server: DatabaseConfig, tmp_path: Path) -> None:
    before = bench_schemas(mariadb_server)
    result = run_bench(mariadb_server, tmp_path, "query-limits")
    assert result.returncode == 0, result.stderr

    printed = summary(result.stdout)
    assert list(printed) == query_limits.figure_names()
    assert all(value > 0 for name, (value, unit) in printed.items() if unit == "ms")
    assert {unit for _, unit in printed.values()} == {"ms", "MiB"}

    results = results_of(tmp_path, "query-limits", printed)
    outcomes = results["parameters"]["outcomes"]
    for rpc in ("list_batches", "list_jobs"):
        assert {outcomes[f"{rpc}.{case}"] for case in ("words_60000", "bytes_1mb", "parens_10000")} \
            == {"INVALID_ARGUMENT"}
        assert {outcomes[f"{rpc}.{case}"] for case in ("legal_longest_words", "legal_most_terms", "legal_costliest")} \
            <= {"OK", "RESOURCE_EXHAUSTED"}
    assert bench_schemas(mariadb_server) == before


def test_supervise_smoke(mariadb_server: DatabaseConfig, tmp_path: Path) -> None:
    result = run_bench(mariadb_server, tmp_path, "supervise")
    assert result.returncode == 0, result.stderr

    printed = summary(result.stdout)
    assert list(printed) == supervise.figure_names()
    assert {unit for _, unit in printed.values()} == {"s"}
    assert all(value > 0 for value, _ in printed.values())
    results = results_of(tmp_path, "supervise", printed)
    assert results["parameters"]["rounds"] == supervise.SMOKE_ROUNDS
    assert results["parameters"]["processes_ended_after_sigkill"] >= 7  # mariadbd, 4 services, a worker, its jobs


def test_job_start_smoke(mariadb_server: DatabaseConfig, tmp_path: Path) -> None:
    result = run_bench(mariadb_server, tmp_path, "job-start", "--concurrency", "4")
    assert result.returncode == 0, result.stderr

    printed = summary(result.stdout)
    modes = tuple(mode for mode in job_start.MODES
                  if {"isolated": can_isolate(), "oci": not oci_start.why_not()}.get(mode, True))
    assert list(printed) == job_start.figure_names(modes)
    for name, (value, unit) in printed.items():
        assert unit == ("starts/s" if name.endswith("starts_per_s") else "ms"), name
        assert value > 0, name
    for mode in modes:
        assert printed[f"job-start.{mode}.cpu_ms.p50"][0] <= printed[f"job-start.{mode}.cpu_ms.p90"][0]

    results = results_of(tmp_path, "job-start", printed)
    parameters = results["parameters"]
    assert (parameters["n_starts"], parameters["concurrency"]) == (job_start.SMOKE_STARTS, 4)
    assert set(parameters["cpu_ms_split_p50"]) == set(modes)
    if "oci" in modes:
        # Every step of a container's start and end was timed, and the container's own CPU counted.
        steps = {step for step, _, _ in oci_start.STEPS}
        assert set(parameters["oci_step_wall_ms_p50"]) in (steps, steps - {oci_start.RUNTIME_DELETE})
        assert parameters["cpu_ms_split_p50"]["oci"]["container"] > 0


def test_job_start_modes(mariadb_server: DatabaseConfig, tmp_path: Path) -> None:
    result = run_bench(mariadb_server, tmp_path, "job-start", "--modes", "unisolated", "--starts", "3")
    assert result.returncode == 0, result.stderr
    assert list(summary(result.stdout)) == job_start.figure_names(("unisolated",))

    refused = run_bench(mariadb_server, tmp_path, "job-start", "--modes", "unisolated,docker")
    assert refused.returncode == 2
    assert "modes are some of isolated, unisolated, oci" in refused.stderr


def test_failover_smoke(mariadb_server: DatabaseConfig, tmp_path: Path) -> None:
    before = bench_schemas(mariadb_server)
    result = run_bench(mariadb_server, tmp_path, "failover")
    assert result.returncode == 0, result.stderr

    printed = summary(result.stdout)
    assert list(printed) == failover.figure_names()
    for name, (value, unit) in printed.items():
        assert unit == ("s" if name.endswith("_s") else "count"), name
        assert value >= 0, name
    # What a pause costs: nothing re-run, nobody declared dead.
    assert printed["failover.attempts_rerun"][0] == printed["failover.workers_declared_dead"][0] == 0

    results = results_of(tmp_path, "failover", printed)
    assert (results["parameters"]["workers"], results["parameters"]["lease_s"]) == (
        failover.SMOKE_WORKERS, failover.SMOKE_LEASE.lease_s)
    assert bench_schemas(mariadb_server) == before


def test_fuzz_query_smoke(mariadb_server: DatabaseConfig, tmp_path: Path) -> None:
    before = bench_schemas(mariadb_server)
    result = run_bench(mariadb_server, tmp_path, "fuzz-query")
    assert result.returncode == 0, result.stderr

    printed = summary(result.stdout)
    assert list(printed) == fuzz_query.figure_names()
    value = {name.removeprefix("fuzz-query."): v for name, (v, _) in printed.items()}
    assert value["inputs"] == fuzz_query.SMOKE_INPUTS == value["parsed"] + value["refused"]
    assert value["parsed"] > 0 and value["refused"] > 0
    failures = ("internal_errors", "property_failures", "grpc.internal_errors", "grpc.wrong_answers")
    assert [value[name] for name in failures] == [0] * 4, result.stderr
    assert value["grpc.calls"] == fuzz_query.SMOKE_GRPC_SAMPLE
    assert value["grpc.calls"] == value["grpc.answered"] + value["grpc.refused"] + value["grpc.statement_limit"]
    assert value["grpc.answered"] > 0 and value["grpc.refused"] > 0

    results = results_of(tmp_path, "fuzz-query", printed)
    assert results["parameters"]["failures_in_process"] == results["parameters"]["failures_over_grpc"] == []
    assert bench_schemas(mariadb_server) == before


@pytest.mark.slow
def test_fuzz_query_of_a_million_inputs(mariadb_server: DatabaseConfig, tmp_path: Path) -> None:
    """The issue's size: 1,000,000 inputs, 2,000 of them over gRPC, without a failure.
    Takes about ten minutes here; the figures are in docs/performance.md."""
    result = subprocess.run(
        [sys.executable, "-m", "bench", "fuzz-query", "--inputs", "1000000", "--database-url",
         database_url(mariadb_server), "--out", str(tmp_path)],
        cwd=REPO_DIR, capture_output=True, text=True, timeout=7200,
    )
    assert result.returncode == 0, result.stderr
    value = {name.removeprefix("fuzz-query."): v for name, (v, _) in summary(result.stdout).items()}
    assert value["inputs"] == 1_000_000 and value["grpc.calls"] == 2_000
    failures = ("internal_errors", "property_failures", "grpc.internal_errors", "grpc.wrong_answers")
    assert [value[name] for name in failures] == [0] * 4, result.stderr


def test_pipeline_scatter_smoke(mariadb_server: DatabaseConfig, tmp_path: Path) -> None:
    """Issue 37's scatter at the smallest size: every output checked by the benchmark itself."""
    result = run_bench(mariadb_server, tmp_path, "pipeline-scatter")
    assert result.returncode == 0, result.stderr
    printed = summary(result.stdout)
    assert list(printed) == pipeline_scatter.figure_names(pipeline_scatter.SMOKE_JOBS)
    assert all(value >= 0 for value, _ in printed.values())
    assert results_of(tmp_path, "pipeline-scatter", printed)["parameters"]["n_jobs"] == pipeline_scatter.SMOKE_JOBS


def test_web_drawing_smoke(mariadb_server: DatabaseConfig, tmp_path: Path) -> None:
    result = run_bench(mariadb_server, tmp_path, "web-drawing")
    assert result.returncode == 0, result.stderr

    printed = summary(result.stdout)
    assert list(printed) == web_drawing.figure_names(smoke=True)
    assert all(value > 0 for name, (value, _) in printed.items() if not name.endswith(".dot_cpu"))  # ms ticks
    assert {unit for _, unit in printed.values()} == {"s", "ms"}
    results = results_of(tmp_path, "web-drawing", printed)
    small, summarised = results["parameters"]["dags"]
    assert small["summary"].endswith("; each job drawn.")
    assert "drawn as" in summarised["summary"] and summarised["n_jobs"] == web_drawing.SMOKE_SIZES[1]
    assert results["parameters"]["timeline"]["n_attempts"] == web_drawing.SMOKE_TIMELINE_ATTEMPTS


def test_web_smoke(mariadb_server: DatabaseConfig, tmp_path: Path) -> None:
    """Every page answers 200 with its Server-Timing (the benchmark refuses anything else), at the smallest
    sizes: the pipelines submitted, every job of the second given an attempt."""
    before = bench_schemas(mariadb_server)
    result = run_bench(mariadb_server, tmp_path, "web")
    assert result.returncode == 0, result.stderr

    printed = summary(result.stdout)
    assert list(printed) == web.figure_names()
    assert all(value > 0 for value, _ in printed.values())
    assert {unit for _, unit in printed.values()} == {"ms", "bytes"}
    parameters = results_of(tmp_path, "web", printed)["parameters"]
    assert parameters["n_batches"] == web.SMOKE_BATCHES
    assert parameters["n_attempts"] == parameters["n_dag_jobs"] > 0
    assert len(parameters["samples"]["big"]["server_ms"]) == web.SMOKE_REPEATS
    assert len(parameters["samples"]["dag_svg_cold"]["server_ms"]) == 1
    assert bench_schemas(mariadb_server) == before
