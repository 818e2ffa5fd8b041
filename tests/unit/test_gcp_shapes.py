"""The GCP provider's pure rules: the machine type for a pool's cores and memory, whether a region's
quotas take a machine, which typed error a Compute Engine failure is, and its configuration file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.driver.providers.errors import (CapacityExhausted, InvalidRequest, PermissionDenied, QuotaExceeded,
                                              TransientError)
from services.driver.providers.gcp_config import MAX_FILE_BYTES, GcpRegion, WorkerBoot, load_config
from services.driver.providers.gcp_shapes import (GIB, SHAPES, SIZES, MachineType, RegionQuota, check_instance_name,
                                                  classify, label_value, machine_type, named_machine_type,
                                                  quota_shortfall)

GIB_PER_VCPU = dict(SHAPES)


def fits(shape: str, vcpus: int, cores_mcpu: int, memory_bytes: int) -> bool:
    return vcpus * 1000 >= cores_mcpu and vcpus * GIB_PER_VCPU[shape] * GIB >= memory_bytes


@given(st.integers(1, 128_000), st.integers(0, 1024 * GIB))
def test_the_machine_holds_the_pool_and_nothing_smaller_does(cores_mcpu: int, memory_bytes: int) -> None:
    possible = [(v, s) for s, _ in SHAPES for v in SIZES[s] if fits(s, v, cores_mcpu, memory_bytes)]
    if not possible:
        with pytest.raises(InvalidRequest):
            machine_type("n2", cores_mcpu, memory_bytes)
        return
    chosen = machine_type("n2", cores_mcpu, memory_bytes)
    family, shape, vcpus = chosen.name.split("-")
    assert (family, int(vcpus)) == ("n2", chosen.vcpus)
    assert fits(shape, chosen.vcpus, cores_mcpu, memory_bytes)
    assert chosen.vcpus == min(v for v, _ in possible)  # the fewest vCPUs
    leaner = [s for s, _ in SHAPES[:[s for s, _ in SHAPES].index(shape)]]
    assert not any(chosen.vcpus in SIZES[s] and fits(s, chosen.vcpus, cores_mcpu, memory_bytes) for s in leaner)


@given(st.integers(1, 96_000), st.integers(0, 64 * GIB), st.integers(0, 64 * GIB))
def test_more_memory_never_gets_a_smaller_machine(cores_mcpu: int, memory_a: int, memory_b: int) -> None:
    small, large = sorted((memory_a, memory_b))
    try:
        bigger = machine_type("n2", cores_mcpu, large)
    except InvalidRequest:
        return
    smaller = machine_type("n2", cores_mcpu, small)
    rank = [s for s, _ in SHAPES]

    def order(machine: MachineType) -> tuple[int, int]:
        return machine.vcpus, rank.index(machine.name.split("-")[1])
    assert order(smaller) <= order(bigger)


def test_machine_types_by_example() -> None:
    assert machine_type("n2", 2000, 0) == MachineType("n2-highcpu-2", 2)
    assert machine_type("n2", 4000, 16 * GIB) == MachineType("n2-standard-4", 4)
    assert machine_type("n2", 4000, 16 * GIB + 1) == MachineType("n2-highmem-4", 4)
    assert machine_type("n2d", 3000, 0) == MachineType("n2d-highcpu-4", 4)
    assert named_machine_type("c3-standard-22", 21_500) == MachineType("c3-standard-22", 22)
    for bad in (lambda: machine_type("N2!", 1000, 0), lambda: machine_type("n2", 0, 0),
                lambda: machine_type("n2", 129_000, 0), lambda: named_machine_type("a b", 1000)):
        with pytest.raises(InvalidRequest):
            bad()


def test_quota_shortfall() -> None:
    machine = MachineType("n2-standard-8", 8)
    quotas = [RegionQuota("CPUS", 24, 16), RegionQuota("INSTANCES", 10, 9), RegionQuota("N2_CPUS", 100, 0),
              RegionQuota("PREEMPTIBLE_CPUS", 0, 0)]
    assert quota_shortfall(quotas, machine, "n2", spot=False) == ""
    assert "CPUS" in quota_shortfall([RegionQuota("CPUS", 24, 17)], machine, "n2", spot=False)
    assert "INSTANCES" in quota_shortfall([RegionQuota("INSTANCES", 10, 10)], machine, "n2", spot=False)
    assert "N2_CPUS" in quota_shortfall([RegionQuota("N2_CPUS", 4, 0)], machine, "n2", spot=False)
    # Spot machines take CPUS without a preemptible quota, PREEMPTIBLE_CPUS with one.
    assert "CPUS" in quota_shortfall([RegionQuota("CPUS", 4, 0)], machine, "n2", spot=True)
    assert quota_shortfall([RegionQuota("CPUS", 4, 0), RegionQuota("PREEMPTIBLE_CPUS", 8, 0)], machine, "n2",
                           spot=True) == ""


def test_names_and_labels() -> None:
    check_instance_name("standard-0a1b2c3d")
    for bad in ("Standard-1", "1abc", "a_b", "a" * 64, "a-"):
        with pytest.raises(InvalidRequest):
            check_instance_name(bad)
    assert label_value("Job Private/42") == "job-private-42"
    assert len(label_value("x" * 100)) == 63


@pytest.mark.parametrize(("status", "codes", "kind"), [
    (503, ["ZONE_RESOURCE_POOL_EXHAUSTED"], CapacityExhausted),
    (503, ["insufficientCapacity"], CapacityExhausted),
    (403, ["QUOTA_EXCEEDED"], QuotaExceeded),
    (403, ["quotaExceeded"], QuotaExceeded),
    (403, ["rateLimitExceeded"], TransientError),
    (403, ["forbidden"], PermissionDenied),
    (401, [], PermissionDenied),
    (429, [], TransientError),
    (500, [], TransientError),
    (400, ["invalid"], InvalidRequest),
    (404, ["notFound"], InvalidRequest),
])
def test_classify(status: int, codes: list[str], kind: type) -> None:
    error = classify(status, codes, "message", region="r", zone="z")
    assert type(error) is kind and (error.region, error.zone) == ("r", "z")


def test_configuration_file(tmp_path: Path) -> None:
    worker = WorkerBoot("enroll:1", ("gw:1",), "PEM")
    path = tmp_path / "gcp.json"
    settings = {"project": "p", "deployment": "prod-1", "boot_image": "projects/p/global/images/family/corral",
                "regions": [{"name": "us-central1", "zones": ["us-central1-a"], "subnetwork": "corral"},
                            {"name": "europe-west4", "zones": ["europe-west4-b"]}],
                "families": {"highmem": "n2d"}, "boot_disk_gb": 100, "worker_command": ["/opt/corral/worker"],
                "billing_api_endpoint": "http://127.0.0.1:9"}
    path.write_text(json.dumps(settings))
    loaded = load_config(path, worker)
    assert loaded.regions == (GcpRegion("us-central1", ("us-central1-a",), "corral"),
                              GcpRegion("europe-west4", ("europe-west4-b",)))
    assert (loaded.families, loaded.boot_disk_gb, loaded.worker_command, loaded.worker) == (
        {"highmem": "n2d"}, 100, ("/opt/corral/worker",), worker)
    assert loaded.billing_api_endpoint == "http://127.0.0.1:9"
    for change, error in [({"regions": []}, "regions"), ({"zone": "x"}, "unknown fields"),
                          ({"boot_disk_gb": "100"}, "boot_disk_gb"), ({"external_ip": 1}, "external_ip"),
                          ({"billing_api_endpoint": 1}, "billing_api_endpoint"),
                          ({"deployment": "Prod"}, "label value"), ({"families": {"x": "N2"}}, "families"),
                          ({"regions": [{"name": "us-central1", "zones": ["europe-west4-a"]}]}, "must be in it")]:
        path.write_text(json.dumps({**settings, **change}))
        with pytest.raises(ValueError, match=error):
            load_config(path, worker)
    del settings["project"]
    path.write_text(json.dumps(settings))
    with pytest.raises(ValueError, match="missing"):
        load_config(path, worker)
    path.write_text(" " * (MAX_FILE_BYTES + 1))
    with pytest.raises(ValueError, match="at most"):
        load_config(path, worker)
