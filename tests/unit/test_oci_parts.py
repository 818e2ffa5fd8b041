"""The OCI runtime's parts that need neither root nor runc: the bundle's
config.json, the refusals, images from a directory, the cgroup hierarchies
read from a mount table, the cgroup v2 files written and read (on a fake
tree: this machine's cgroups are v1), and the walks that never follow an
image's links. The runtime itself is tested for real in tests/oci."""

from __future__ import annotations

import os
from ipaddress import IPv4Network
from pathlib import Path

import pytest

from corral.batch.v1 import job_spec_pb2 as js
from services.worker.oci import oci_refusals
from services.worker.oci.bundle import Container, config_json, merged_env
from services.worker.host_limits import ProcessCount, hit_own_limit
from services.worker.oci.cgroups import V1, V2, AttemptCgroup, Hierarchies, Limits, Usage, read_usage
from services.worker.oci.owner import Owner
from services.worker.worker_cgroup import ProcessRuntimeClaim, WorkerCgroup
from services.worker.oci.images import DirectoryRootfs, ImageConfig, ImageUnavailable
from services.worker.oci.network import (FALLBACK_RESOLVERS, NON_PUBLIC, PRIVATE, PUBLIC, Plan, choose_subnet,
                                         resolvers)
from services.worker.oci.layer import LayerError, ensure_dir, mounts_under, open_root
from services.worker.oci.runc import Runc, RuncError, crun_refusals


def container(**fields) -> Container:
    settings = dict(argv=("/bin/sh", "-c", "true"), env=("PATH=/bin",), cwd="/io", uid=2_000_000_001,
                    gid=2_000_000_001, hostname="job-1-2", cgroups_path="/corral/w/1-2-a/job", network_namespace="",
                    shm_bytes=64 * 2**20, max_open_files=1024)
    return Container(**{**settings, **fields})


def test_the_container_has_no_privilege() -> None:
    config = config_json(container(), machine="x86_64")
    process = config["process"]
    assert process["user"] == {"uid": 2_000_000_001, "gid": 2_000_000_001, "additionalGids": [], "umask": 0o022}
    assert all(caps == [] for caps in process["capabilities"].values()) and len(process["capabilities"]) == 5
    assert process["noNewPrivileges"] is True and process["terminal"] is False
    assert {"type": "RLIMIT_CORE", "hard": 0, "soft": 0} in process["rlimits"]
    linux = config["linux"]
    assert [n["type"] for n in linux["namespaces"]] == ["pid", "ipc", "uts", "mount", "cgroup", "network"]
    assert "/proc/kcore" in linux["maskedPaths"] and "/proc/sys" in linux["readonlyPaths"]
    assert linux["cgroupsPath"] == "/corral/w/1-2-a/job"
    assert linux["resources"] == {"devices": [{"allow": False, "access": "rwm"}]}  # the limits are the parent's
    assert config["root"] == {"path": "rootfs", "readonly": False}
    assert config["hostname"] == "job-1-2"


def test_the_seccomp_filter_refuses_namespaces_and_kernel_interfaces() -> None:
    seccomp = config_json(container(), machine="x86_64")["linux"]["seccomp"]
    assert seccomp["defaultAction"] == "SCMP_ACT_ALLOW"
    assert seccomp["architectures"] == ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"]
    denied = {name for rule in seccomp["syscalls"] if "args" not in rule and rule["errnoRet"] == 1
              for name in rule["names"]}
    assert {"unshare", "setns", "mount", "keyctl", "bpf", "userfaultfd", "io_uring_setup", "perf_event_open"} <= denied
    clone_flags = {rule["args"][0]["value"] for rule in seccomp["syscalls"] if rule["names"] == ["clone"]}
    assert 0x10000000 in clone_flags and len(clone_flags) == 7  # CLONE_NEWUSER among the seven
    assert {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38} in seccomp["syscalls"]


def test_secrets_are_read_only_binds_and_shm_has_its_size() -> None:
    mounts = config_json(container(read_only_binds=(("/host/s/0", "/run/secrets/db"),), shm_bytes=2**20),
                         machine="x86_64")["mounts"]
    assert {"destination": "/run/secrets/db", "type": "bind", "source": "/host/s/0",
            "options": ["bind", "ro", "nosuid", "nodev", "noexec"]} in mounts
    (shm,) = [m for m in mounts if m["destination"] == "/dev/shm"]
    assert "size=1024k" in shm["options"]
    assert not any(m["destination"].startswith("/sys/fs/cgroup") for m in mounts)


def test_environment_layers_later_wins_in_the_first_place() -> None:
    assert merged_env({"PATH": "/bin", "HOME": "/io"}, ["PATH=/usr/bin", "LANG=C"], {"HOME": "/home/me"}) == (
        "PATH=/usr/bin", "HOME=/home/me", "LANG=C")
    assert merged_env(["A=x=y", "B="]) == ("A=x=y", "B=")


def spec(**fields) -> js.JobSpec:
    return js.JobSpec(image="busybox", script="true", network_mode=js.NETWORK_MODE_NONE, **fields)


def test_refusals() -> None:
    assert oci_refusals(spec()) == []
    for mode in (js.NETWORK_MODE_UNSPECIFIED, js.NETWORK_MODE_PRIVATE, js.NETWORK_MODE_PUBLIC):
        assert oci_refusals(js.JobSpec(image="busybox", script="true", network_mode=mode)) == []
    hidden = spec(input_files=[js.InputFile(from_url="file:///x", to_path="/proc/x"),
                               js.InputFile(from_url="file:///x", to_path="/run/secrets/db/key")],
                  output_files=[js.OutputFile(from_path="/dev/shm/out", to_url="file:///y")],
                  secrets=[js.SecretMount(name="db", mount_path="/run/secrets/db")])
    assert len(oci_refusals(hidden)) == 3
    assert oci_refusals(spec(input_files=[js.InputFile(from_url="gs://b/x", to_path="/in/x")])) == []
    (reason,) = oci_refusals(spec(input_files=[js.InputFile(from_url="s3://b/x", to_path="/in/x")]))
    assert reason.startswith("input URL 's3://b/x' is not one a worker copies")
    assert oci_refusals(js.JobSpec(image="busybox", network_mode=js.NETWORK_MODE_NONE)) == [
        "the spec has no command (argv or script)"]


async def test_directory_images(tmp_path: Path) -> None:
    (tmp_path / "tools:1.2" / "rootfs").mkdir(parents=True)
    (tmp_path / "tools:1.2" / "config.json").write_text(
        '{"process": {"env": ["PATH=/opt/bin", "X=1"], "cwd": "/work"}}')  # as umoci unpack writes it
    (tmp_path / "plain" / "rootfs").mkdir(parents=True)
    images = DirectoryRootfs(tmp_path)
    tools = await images.acquire("tools:1.2")
    assert tools.path == tmp_path / "tools:1.2" / "rootfs"
    assert tools.config == ImageConfig(env=("PATH=/opt/bin", "X=1"), working_dir="/work")
    assert tools.digest.startswith("dir:sha256:")
    assert (await images.acquire("plain")).config == ImageConfig()
    for name, why in (("nope", "no image 'nope' here"), ("../etc", "is not a plain NAME[:TAG]"),
                      ("/etc", "is not a plain NAME[:TAG]")):
        with pytest.raises(ImageUnavailable, match=why.replace("[", r"\[").replace("]", r"\]")):
            await images.acquire(name)


def test_an_oci_image_config() -> None:
    config = ImageConfig.from_oci({"config": {"Env": ["A=1"], "WorkingDir": "/w", "User": "app",
                                              "Entrypoint": ["/e"], "Cmd": ["c"]}})
    assert config == ImageConfig(env=("A=1",), working_dir="/w", user="app", entrypoint=("/e",), cmd=("c",))
    assert ImageConfig.from_oci({}) == ImageConfig()


HYBRID = """\
25 1 0:23 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
26 25 0:24 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
27 25 0:25 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,name=systemd
28 25 0:26 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
29 25 0:27 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
30 25 0:28 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
31 1 8:1 / /srv/scratch/a\\040b rw - ext4 /dev/sda1 rw
"""


def test_hierarchies_of_a_hybrid_host(tmp_path: Path) -> None:
    (tmp_path / "mountinfo").write_text(HYBRID)
    found = Hierarchies.of_host(tmp_path / "mountinfo")
    assert found.version == V1 and found.missing() == []
    assert found.by_controller["cpuacct"] == Path("/sys/fs/cgroup/cpu,cpuacct")
    assert len(found.all) == 5  # the unified and the named hierarchies too: runc makes its cgroup there
    assert mounts_under(Path("/srv/scratch"), tmp_path / "mountinfo") == [Path("/srv/scratch/a b")]


def fake_v2(tmp_path: Path) -> Hierarchies:
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (root / "cgroup.subtree_control").touch()
    (tmp_path / "mountinfo").write_text(f"26 1 0:24 / {root} rw - cgroup2 cgroup2 rw\n")
    return Hierarchies.of_host(tmp_path / "mountinfo")


def test_cgroup_v2_limits_oom_and_usage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hierarchies = fake_v2(tmp_path)
    assert hierarchies.version == V2 and hierarchies.missing() == []
    root = hierarchies.by_controller["memory"]
    made = []
    real_mkdir = Path.mkdir

    def mkdir(path: Path, *args, **kwargs) -> None:  # a cgroup directory comes with its files
        real_mkdir(path, *args, **kwargs)
        made.append(path)
        for name in ("cgroup.subtree_control", "memory.max", "memory.swap.max", "cpu.max", "pids.max"):
            (path / name).touch()

    monkeypatch.setattr(Path, "mkdir", mkdir)
    cgroup = AttemptCgroup.create(hierarchies, "/corral/w/1-2-a", Limits(250, 2**30, 100))
    attempt = root / "corral" / "w" / "1-2-a"
    assert made == [root / "corral", root / "corral" / "w", attempt]
    assert (root / "cgroup.subtree_control").read_text() == "+cpu +memory +pids"
    assert (root / "corral" / "w" / "cgroup.subtree_control").read_text() == "+cpu +memory +pids"
    assert [(attempt / f).read_text() for f in ("memory.max", "memory.swap.max", "cpu.max", "pids.max")] == [
        str(2**30), "0", "25000 100000", "100"]
    assert cgroup.runc_path == "/corral/w/1-2-a/job"
    (attempt / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 0\n")
    assert not cgroup.out_of_memory()
    (attempt / "memory.events").write_text("low 0\nhigh 0\nmax 9\noom 2\noom_kill 1\n")
    assert cgroup.out_of_memory()
    (attempt / "cpu.stat").write_text("usage_usec 1234567\nuser_usec 1000000\n")
    (attempt / "memory.peak").write_text("52428800\n")
    assert read_usage(hierarchies, "/corral/w/1-2-a") == Usage(cpu_time_ms=1234, peak_memory_bytes=50 * 2**20)


def test_cgroup_v2_the_workers_and_deployments_caps_and_refused_forks(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The levels above the attempts pass the controllers down and carry their own pids.max; an attempt of the
    process runtime gets pids only; refused forks are read from the attempt's pids.events and runc's."""
    hierarchies = fake_v2(tmp_path)
    root = hierarchies.by_controller["pids"]
    real_mkdir = Path.mkdir

    def mkdir(path: Path, *args, **kwargs) -> None:  # a cgroup directory comes with its files
        real_mkdir(path, *args, **kwargs)
        for name in ("cgroup.subtree_control", "pids.max"):
            (path / name).touch()

    monkeypatch.setattr(Path, "mkdir", mkdir)
    worker = WorkerCgroup(hierarchies, "corral", "up-1", "w7")
    worker.create(3072, 16384)
    assert [(root / d / "cgroup.subtree_control").read_text() for d in ("", "corral", "corral/up-1")] == [
        "+cpu +memory +pids"] * 3
    assert (root / "corral/up-1/pids.max").read_text() == "16384"
    assert (root / "corral/up-1/w7/pids.max").read_text() == "3072"
    assert worker.exists() and worker.path == "/corral/up-1/w7"
    processes_only = WorkerCgroup(hierarchies, "corral", "up-1", "w8", ("pids",))
    processes_only.create(300, 1000)
    attempt = AttemptCgroup.create_for_processes(hierarchies, "/corral/up-1/w8/7-3-a1", 75)
    assert (root / "corral/up-1/w8/cgroup.subtree_control").read_text() == "+pids"
    assert (root / "corral/up-1/w8/7-3-a1/pids.max").read_text() == "75"
    assert attempt.processes() == ProcessCount(refused=0, current=0, peak=None, limit=75)
    (root / "corral/up-1/w8/7-3-a1/pids.current").write_text("75\n")
    (root / "corral/up-1/w8/7-3-a1/pids.peak").write_text("75\n")
    (root / "corral/up-1/w8/7-3-a1/pids.events").write_text("max 12\n")
    assert attempt.processes() == ProcessCount(refused=12, current=75, peak=75, limit=75)
    (root / "corral/up-1/w8/7-3-a1/job").mkdir()  # runc's, where the kernel counts a v1 refusal
    (root / "corral/up-1/w8/7-3-a1/job/pids.events").write_text("max 3\n")
    assert attempt.processes().refused == 15
    (root / "corral/up-1/w7/pids.current").write_text("40\n")
    assert worker.processes() == (40, 3072)


def test_cgroup_v1_refused_forks_go_with_cruns_cgroup(tmp_path: Path) -> None:
    """cgroup v1 counts a refused fork in runc's cgroup below the attempt's; crun removes that one as its
    container exits, and an attempt whose peak reached its own cap is then taken to have hit it."""
    hierarchies = Hierarchies(V1, {"pids": tmp_path / "pids"}, (tmp_path / "pids",))
    attempt_dir = tmp_path / "pids/corral/d/w/7-3-a1"
    (attempt_dir / "job").mkdir(parents=True)
    for name, value in (("pids.max", "75"), ("pids.current", "0"), ("pids.peak", "75"), ("pids.events", "max 0")):
        (attempt_dir / name).write_text(f"{value}\n")
    (attempt_dir / "job/pids.events").write_text("max 4\n")
    cgroup = AttemptCgroup(hierarchies, "/corral/d/w/7-3-a1")
    cgroup.container = True
    count = cgroup.processes()
    assert count.refused == 4 and count.refusals_known and hit_own_limit(count)
    (attempt_dir / "job/pids.events").unlink()
    (attempt_dir / "job").rmdir()  # the container exited
    count = cgroup.processes()
    assert count.refused == 0 and not count.refusals_known and hit_own_limit(count)
    (attempt_dir / "pids.peak").write_text("40\n")
    assert not hit_own_limit(cgroup.processes())  # below its own cap: not its limit
    # The process runtime's jobs fork in the attempt's cgroup itself: its count is all there is.
    assert AttemptCgroup(hierarchies, "/corral/d/w/7-3-a1").processes().refusals_known


def test_a_dead_process_runtimes_claim_is_swept_and_a_live_ones_kept(tmp_path: Path) -> None:
    hierarchies = Hierarchies(V1, {"pids": tmp_path / "pids"}, (tmp_path / "pids",))
    for name in ("dead", "live", "mine"):
        (tmp_path / "pids" / "corral" / "d" / name / "7-3-a1").mkdir(parents=True)
    claims = tmp_path / "claims"
    live = ProcessRuntimeClaim(claims, "live")
    assert live.claim("/corral/d/live")
    claims.joinpath("dead").write_text("/corral/d/dead")  # its holder is gone: no lock on it
    claims.joinpath("half").write_text("")  # being claimed this moment: left alone
    mine = ProcessRuntimeClaim(claims, "mine")
    assert mine.claim("/corral/d/mine")
    assert not ProcessRuntimeClaim(claims, "live").claim("/corral/d/live")  # a live runtime has the name
    assert mine.remove_dead(hierarchies) == []
    assert sorted(p.name for p in (tmp_path / "pids/corral/d").iterdir()) == ["live", "mine"]
    assert sorted(p.name for p in claims.iterdir()) == ["half", "live", "mine"]
    live.release(removed=False)
    assert (claims / "live").read_text() == "/corral/d/live"


def test_a_dead_owners_cgroup_is_found_where_it_wrote_it(tmp_path: Path) -> None:
    """A runtime writes its cgroup's path when it claims its name; one from before deployments wrote none and
    had its cgroup right below the root."""
    owner = Owner(tmp_path, "w1", "/corral/up-1/w1")
    owner.claim()
    assert Owner.found(tmp_path, "w1", "corral").cgroup_parent == "/corral/up-1/w1"
    (tmp_path / "old").mkdir()
    assert Owner.found(tmp_path, "old", "corral").cgroup_parent == "/corral/old"
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "cgroup").write_text("/elsewhere/x")  # never outside the runtimes' root
    assert Owner.found(tmp_path, "odd", "corral").cgroup_parent == "/corral/odd"
    (tmp_path / "odd" / "cgroup").write_text("/corral/../x")
    assert Owner.found(tmp_path, "odd", "corral").cgroup_parent == "/corral/odd"
    owner.release()


def test_the_workers_walks_never_follow_an_images_links(tmp_path: Path) -> None:
    root = tmp_path / "rootfs"
    (root / "etc").mkdir(parents=True)
    (root / "io").symlink_to("/etc")  # an image could ship this
    (root / "tmp").symlink_to("etc")
    fd = open_root(root)
    try:
        for path in ("/io", "/tmp/x"):
            with pytest.raises(LayerError, match="is a symbolic link or not a directory"):
                ensure_dir(fd, path, 0o700)
        ensure_dir(fd, "/data/in", 0o750)
    finally:
        os.close(fd)
    assert (root / "data").stat().st_mode & 0o777 == 0o755 and (root / "data" / "in").stat().st_mode & 0o777 == 0o750
    assert not (Path("/etc") / "x").exists()


def test_a_workers_network_plan() -> None:
    plan = Plan("0a1b2c3d", IPv4Network("10.199.7.0/24"), (IPv4Network("10.197.0.0/16"),))
    assert (plan.bridge(PUBLIC), plan.bridge(PRIVATE)) == ("crl-0a1b2c3d-p", "crl-0a1b2c3d-v")
    assert all(len(plan.bridge(m)) <= 15 for m in (PUBLIC, PRIVATE))
    assert (str(plan.gateway(PUBLIC)), str(plan.gateway(PRIVATE))) == ("10.199.7.1", "10.199.7.129")
    assert str(plan.addresses(PUBLIC)[0]) == "10.199.7.2" and str(plan.addresses(PRIVATE)[-1]) == "10.199.7.254"
    assert Plan.from_json(plan.to_json()) == plan
    forward = [rule for table, chain, rule in plan.rules() if chain == plan.chain("FWD")]
    # Every worker's bridges (SUBNETS) refused before anything is let out, whoever's jump comes first.
    assert forward.index(["-d", "10.199.0.0/16", "-j", "DROP"]) < min(
        i for i, r in enumerate(forward) if r[-1] == "ACCEPT" and "--ctstate" not in r)
    # Public: every non-public range and the private ranges refused before everything else is let out.
    public = [r for r in forward if r[:2] == ["-i", "crl-0a1b2c3d-p"]]
    assert public == ([["-i", "crl-0a1b2c3d-p", "-d", str(n), "-j", "DROP"] for n in NON_PUBLIC]
                      + [["-i", "crl-0a1b2c3d-p", "-d", "10.197.0.0/16", "-j", "DROP"],
                         ["-i", "crl-0a1b2c3d-p", "-s", "10.199.7.0/25", "-j", "ACCEPT"]])
    # Private: only the private ranges; then everything else is dropped.
    assert [r for r in forward if r[:2] == ["-i", "crl-0a1b2c3d-v"]] == [
        ["-i", "crl-0a1b2c3d-v", "-s", "10.199.7.128/25", "-d", "10.197.0.0/16", "-j", "ACCEPT"]]
    assert forward[-1] == ["-j", "DROP"]
    host = [rule for table, chain, rule in plan.rules() if chain == plan.chain("IN")]
    assert host[0] == ["-d", "10.199.0.0/16", "-j", "DROP"] and host[-1] == ["-j", "DROP"]
    assert all(r[1] == "crl-0a1b2c3d-v" for r in host[1:-1])
    assert [rule for table, chain, rule in plan.rules() if chain == plan.chain("OUT")] == [
        ["-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"], ["-j", "DROP"]]
    assert {chain for _, chain, _ in plan.jumps()} == {"INPUT", "FORWARD", "OUTPUT", "POSTROUTING"}


def test_a_subnet_is_chosen_from_the_owner_and_skips_what_the_host_has() -> None:
    first = choose_subnet("00000007", [])
    assert first == IPv4Network("10.199.7.0/24")
    assert choose_subnet("00000007", [IPv4Network("10.199.7.128/25")]) == IPv4Network("10.199.8.0/24")
    assert choose_subnet("000000ff", [IPv4Network("10.199.255.0/24")]) == IPv4Network("10.199.0.0/24")
    assert choose_subnet("00000007", [IPv4Network("10.0.0.0/8")]) is None


def test_resolvers_a_job_can_reach() -> None:
    conf = ("# x\nnameserver 127.0.0.53\nnameserver 10.255.255.53\nnameserver 169.254.169.254\n"
            "nameserver 9.9.9.9\nnameserver 10.197.0.2\nnameserver ::1\n")
    private = (IPv4Network("10.197.0.0/16"),)
    assert resolvers(conf, PUBLIC, private) == ["9.9.9.9"]  # a public job reaches no private range's resolver
    assert resolvers(conf, PRIVATE, private) == ["10.197.0.2"]
    assert resolvers("nameserver 127.0.0.53\n", PUBLIC, ()) == list(FALLBACK_RESOLVERS)
    assert resolvers("nameserver 127.0.0.53\n", PRIVATE, ()) == []


def test_crun_is_refused_where_cgroup_v2_holds_a_controller_beside_v1(tmp_path: Path) -> None:
    hybrid = tmp_path / "unified"
    hybrid.mkdir()
    (hybrid / "cgroup.controllers").write_text("hugetlb\n")
    assert crun_refusals(hybrid) == [
        f"crun refuses this host's hybrid cgroup layout: its cgroup v2 ({hybrid}) holds the controllers hugetlb "
        "(mount each as a cgroup v1 hierarchy to free it, as scripts/setup.sh does)"]
    (hybrid / "cgroup.controllers").write_text("\n")
    assert crun_refusals(hybrid) == []
    assert crun_refusals(tmp_path / "absent") == []  # v1 alone, or v2 alone


async def test_a_container_gone_while_it_is_deleted_is_deleted(tmp_path: Path) -> None:
    """`delete` of a container whose state its runtime removed meanwhile (its crashing container exited) is
    done: crun then says it cannot open the container's state directory. Any other refusal still raises. The
    stand-in answers with the words crun gave in a CI run."""
    root = tmp_path / "state"
    root.mkdir()
    stand_in = tmp_path / "crun"
    stand_in.write_text("#!/bin/sh\n"
                        "for last; do :; done\n"
                        f"echo \"crun: cannot open directory '{root}/$last': No such file or directory\" >&2\n"
                        "exit 1\n")
    stand_in.chmod(0o755)
    await Runc(str(stand_in), root).delete("w-9-1-crash")
    other = tmp_path / "other"
    other.write_text("#!/bin/sh\necho 'crun: cannot open directory /sys/fs/cgroup/x: No such file or directory' >&2\n"
                     "exit 1\n")
    other.chmod(0o755)
    with pytest.raises(RuncError, match="cgroup"):
        await Runc(str(other), root).delete("w-9-1-crash")
