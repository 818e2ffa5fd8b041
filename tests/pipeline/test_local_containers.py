"""LocalBackend running jobs in containers, under real runc as root, with the worker's OCI runtime: the
Debian base images `debian` and `python` from the machine's base image cache (built there once, as
tests/oci/test_oci_base_images.py builds them, minutes the first time), a file passed between jobs, a failure,
images that cannot be had, what a job can see and do, and nothing left behind."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import corral.pipeline as hb
from services.worker.pipeline_containers import why_not_containers
from corral.pipeline.backend.local import SAYS_CONTAINERS
from corral.pipeline.exceptions import BatchException
from services.registry import seed, seed_cache
from services.worker.oci.layer import mounts_under
from tests.conftest import BASE_IMAGE_CACHE

WHY_NOT = "; ".join(why_not_containers())
pytestmark = [pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT or "-"), pytest.mark.timeout(900)]
STATE_ROOT = Path("/run/corral/oci")
"""OciRuntimeConfig's default state root: one directory per runtime, `pipeline-PID-XXXXXX` for LocalBackend's."""
CGROUPS = Path("/sys/fs/cgroup")
PIPELINE_CGROUPS = "**/corral/pipeline/pipeline-*"
"""LocalBackend's runtimes' cgroups, in any hierarchy (v1 or v2)."""


@pytest.fixture(scope="module", autouse=True)
def base_images() -> None:
    """`debian` and `python` in the machine's base image cache, where LocalBackend looks for them."""
    for name in ("debian", "python"):
        image = seed.BASE_IMAGES[name]
        seed_cache.cached(BASE_IMAGE_CACHE, name, image.stamp(), image.build)


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[hb.LocalBackend]:
    """A backend whose runs must leave nothing: no runtime state of theirs, no cgroup, no mount, no work
    directory."""
    before = {p.name for p in STATE_ROOT.glob("pipeline-*")} if STATE_ROOT.exists() else set()
    cgroups_before = set(CGROUPS.glob(PIPELINE_CGROUPS))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    with hb.LocalBackend(tmp_dir=str(scratch), containers=True) as backend:
        yield backend
    left = {p.name for p in STATE_ROOT.glob("pipeline-*")} - before if STATE_ROOT.exists() else set()
    assert left == set()
    assert set(CGROUPS.glob(PIPELINE_CGROUPS)) - cgroups_before == set()
    assert mounts_under(tmp_path) == []
    assert list(scratch.glob("containers-*")) == []


def test_bash_jobs_in_debian_pass_a_file(backend: hb.LocalBackend, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data.txt"
    data.write_text("alice\nbob\ncarol\n")
    b = hb.Batch(backend=backend, default_image="debian")
    reads = b.read_input(str(data))
    count = b.new_job(name="count")
    count.command(f"cat /etc/debian_version > {count.version}; wc -l < {reads} > {count.ofile}")
    double = b.new_job(name="double")
    double.command(f"echo $(( $(cat {count.ofile}) * 2 )) > {double.ofile}")
    b.write_output(double.ofile, str(tmp_path / "doubled.txt"))
    b.write_output(count.version, str(tmp_path / "version.txt"))
    b.run()
    assert capsys.readouterr().out.splitlines()[0] == SAYS_CONTAINERS
    assert (tmp_path / "doubled.txt").read_text() == "6\n"
    assert (tmp_path / "version.txt").read_text().startswith("12.")  # bookworm's, not this machine's


def square_lines(path: str) -> list[int]:
    import sys
    with open(path) as f:
        return [int(line) ** 2 for line in f] + [sys.version_info[1]]


def test_a_python_job_in_python_reads_a_bash_jobs_file(backend: hb.LocalBackend, tmp_path: Path) -> None:
    b = hb.Batch(backend=backend)
    numbers = b.new_job(name="numbers").image("debian")
    numbers.command(f"seq 1 4 > {numbers.ofile}")
    squares = b.new_python_job(name="squares").call(square_lines, numbers.ofile)
    b.write_output(squares.as_json(), str(tmp_path / "squares.json"))
    b.run()
    assert (tmp_path / "squares.json").read_text() == "[1, 4, 9, 16, 11]\n"  # the python image's 3.11


def test_a_failing_job_raises_and_its_dependents_do_not_run(backend: hb.LocalBackend, tmp_path: Path) -> None:
    b = hb.Batch(backend=backend, default_image="debian")
    fails = b.new_job(name="fails")
    fails.command(f"echo about to fail; touch {fails.ofile}; exit 3")
    after = b.new_job(name="after")
    after.command(f"cat {fails.ofile} > {after.ofile}")
    b.write_output(after.ofile, str(tmp_path / "after.txt"))
    with pytest.raises(subprocess.CalledProcessError) as raised:
        b.run()
    assert raised.value.returncode == 3
    assert b"about to fail" in raised.value.output
    assert not (tmp_path / "after.txt").exists()


def test_an_image_not_built_or_not_there_fails_the_batch_before_any_job_runs(
        backend: hb.LocalBackend, tmp_path: Path) -> None:
    b = hb.Batch(backend=backend, default_image="debian")
    first = b.new_job(name="first")
    first.command(f"echo ran > {first.ofile}")
    b.write_output(first.ofile, str(tmp_path / "ran.txt"))
    nowhere = b.new_job(name="nowhere").image(f"oci-layout://{tmp_path}/no-layout:1.0")
    nowhere.command("true")
    with pytest.raises(BatchException, match=rf"image 'oci-layout://{tmp_path}/no-layout:1.0': no OCI image "
                                             rf"layout at {tmp_path}/no-layout"):
        b.run()
    assert not (tmp_path / "ran.txt").exists()


def test_an_image_no_registry_has_fails_its_job_naming_it(backend: hb.LocalBackend) -> None:
    b = hb.Batch(backend=backend)
    j = b.new_job(name="unreachable").image("registry.invalid/nothing/here:1")
    j.command("true")
    with pytest.raises(BatchException, match=r"ended in error: .*'registry.invalid/nothing/here:1'"):
        b.run()


def test_a_job_sees_only_its_files_as_a_uid_of_its_own_with_loopback_only(
        backend: hb.LocalBackend, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"  # on the host, outside anything the job is given
    secret.write_text("not for jobs\n")
    b = hb.Batch(backend=backend, default_image="debian")
    j = b.new_job(name="look")
    j.command(f"{{ id -u; test -e {secret} && echo sees-host-file || echo no-host-file; "
              f"ls /sys/class/net; touch /etc/mine 2>/dev/null && echo wrote-etc || echo no-etc; }} > {j.ofile}")
    b.write_output(j.ofile, str(tmp_path / "look.txt"))
    b.run()
    uid, seen, *rest = (tmp_path / "look.txt").read_text().split()
    assert int(uid) != 0 and int(uid) != os.geteuid()
    assert seen == "no-host-file"
    assert rest == ["lo", "no-etc"]


def allocate(megabytes: int) -> int:
    block = bytearray(megabytes * 2**20)
    for i in range(0, len(block), 4096):  # touch every page: resident, not just reserved
        block[i] = 1
    return len(block)


def test_a_python_job_over_its_memory_is_killed(backend: hb.LocalBackend) -> None:
    b = hb.Batch(backend=backend)
    j = b.new_python_job(name="greedy")
    j.memory("100Mi")
    j.call(allocate, 400)
    with pytest.raises(subprocess.CalledProcessError) as raised:
        b.run()
    assert raised.value.returncode == 137  # SIGKILL by the kernel at its cgroup's limit


def test_containers_false_runs_processes_and_says_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    b = hb.Batch(backend=hb.LocalBackend(tmp_dir=str(tmp_path), containers=False))
    j = b.new_job(name="here").image("no-such-image")  # a process: its image is not used
    j.command(f"id -u > {j.ofile}")
    b.write_output(j.ofile, str(tmp_path / "uid.txt"))
    b.run()
    assert capsys.readouterr().out.splitlines()[0].endswith("not enforced): asked for (containers=False)")
    assert (tmp_path / "uid.txt").read_text() == f"{os.geteuid()}\n"
