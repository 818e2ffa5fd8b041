"""The OCI runtime: each attempt in a container of its own, run by crun or runc.
(The interface and what outcomes mean are in runtime_api.py; the parts of
an attempt in the modules beside this one.)

One attempt, in order; each step that fails ends it in Error naming the
step, and whatever was made is undone whatever happens (`_teardown`):

1. a uid of its own (job_uids.py, as the process runtime's), a record of
   the attempt under the worker's name (owner.py);
2. the image's root filesystem from the `RootfsSource`, and the attempt's
   writable layer over it (layer.py): the work directory /io (the job's,
   0700), /tmp, the inputs (job_files.py), secrets on a tmpfs;
3. its cgroup with its limits and the out-of-memory watch (cgroups.py),
   below its worker's and its deployment's, which the runtime makes when
   it starts, each with a process cap (worker_cgroup.py, host_limits.py);
4. for a private or public network, a namespace with its veth pair and
   address, kept from an earlier attempt once reset, or made (slots.py),
   and a resolv.conf;
5. the bundle's config.json (bundle.py), then the container runtime's
   `run` (crun where it can run here, else runc: runc.py), started by the
   worker's keeper (keeper.py), the output into the log;
6. while it runs, the watch over its limits (attempt_limits.py): a fork
   the kernel refused at its process cap, or its writable layer holding
   more than its storage request, kills it (RLIMIT_FSIZE holds each file
   to that size meanwhile);
7. the end: exit code, timeout, cancel or a limit; out of memory from the
   cgroup; cpu time and peak memory from the cgroup; outputs copied on
   success.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import resource
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from corral.batch.v1 import job_spec_pb2
from services.policy.sizes import binary_size
from services.worker.disk import is_full, out_of_space, ran_out, reports_out_of_space
from services.worker.host_limits import (attempt_max_processes, default_deployment_max_processes,
                                         worker_max_processes)
from services.worker.job_files import copy_inputs, copy_outputs, copy_outputs_after_failure, path_refusals
from services.worker.job_uids import JobUids, NoFreeUid, UidClaim
from services.worker.logs import LogPipe, LogSink
from services.worker.oci import cgroups, layer, network, slots
from services.worker.oci.bundle import Container, config_json, merged_env
from services.worker.oci.config import OciRuntimeConfig
from services.worker.oci.images import ImageUnavailable, Rootfs
from services.worker.oci.owner import AttemptRecord, Owner, OwnerBusy, clean_up, clean_up_dead_owners
from services.worker.oci.refusals import oci_refusals
from services.worker.oci.runc import (Keeper, KeptContainer, Runc, RuncError, choose, kind_of, last_error,
                                     wait_until_running)
from services.worker.runtime_api import (CANCELLED, EXITED, OUT_OF_MEMORY, REFUSED, SYSTEM_ERROR, TIMED_OUT,
                                         JobOutcome, JobRun, attempt_timeout_s, signal_name)
from services.worker import attempt_limits, worker_cgroup  # modules: they import this package's cgroups
from services.common.usage_series import UsageReading

logger = logging.getLogger(__name__)

WORK_DIR = "/io"
"""The job's own directory in the container: its working directory unless the image names one, and HOME."""
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
OVER_LIMIT = "over_limit"
"""How `_supervise` says the limit watch ended the attempt (its words in `_Attempt.over_limit`)."""


class AttemptFailed(Exception):
    """The system failed around the job at `step`; the attempt ends in Error (system_error: tried again,
    away from this worker)."""

    def __init__(self, step: str, message: str):
        super().__init__(f"{step}: {message}")


class AttemptRefused(AttemptFailed):
    """The job's spec cannot be run at `step` anywhere (its image does not exist, its registry login is
    refused): Error with reason refused, not tried again."""


def host_refusals(container_runtime: str = "auto") -> list[str]:
    """Why this machine cannot run the OCI runtime at all (with `container_runtime`: see
    OciRuntimeConfig); empty if it can. `corral up` asks too, to say where its workers' jobs will run."""
    reasons = []
    if os.geteuid() != 0:
        reasons.append(f"the OCI runtime runs containers as root (this process runs as uid {os.geteuid()})")
    reasons += choose(container_runtime)[1]
    try:
        if missing := cgroups.Hierarchies.of_host().missing():
            reasons.append(f"the cgroup controllers {', '.join(missing)} are not mounted")
    except (cgroups.CgroupError, OSError) as e:
        reasons.append(str(e))
    return reasons


class OciRuntime:
    """Runs each attempt in a container of its own, with crun or runc (see the module's docstring and
    docs/containers.md). Needs root on Linux, crun or runc, and cgroups with the memory,
    cpu, cpuacct and pids controllers (v1, or v2)."""

    name = "oci"
    isolates = True
    usage_note = ""

    def __init__(self, config: OciRuntimeConfig):
        if not _ID.fullmatch(config.owner):
            raise ValueError(f"owner {config.owner!r}: letters, digits, '.', '_' and '-' only")
        if config.layer not in ("auto", layer.OVERLAY, layer.COPY):
            raise ValueError(f"layer {config.layer!r}: 'auto', 'overlayfs' or 'copy'")
        if not _ID.fullmatch(config.deployment):
            raise ValueError(f"deployment {config.deployment!r}: letters, digits, '.', '_' and '-' only")
        self.config = config
        self.owner = Owner(config.state_root, config.owner, f"/{config.cgroup_root}/{config.deployment}/{config.owner}")
        self.cores_mcpu = config.cores_mcpu or 1000 * (os.cpu_count() or 1)
        """The worker's cores, which its process cap and each attempt's share come from."""
        self.max_processes = worker_max_processes(self.cores_mcpu, config.max_processes_per_core,
                                                  config.max_processes_base)
        """The worker's cgroup's pids.max."""
        self._worker_cgroup: worker_cgroup.WorkerCgroup | None = None
        self._uids = JobUids(config.uid_claims_dir, config.uid_first, config.uid_count)
        self._stops: dict[str, asyncio.Event] = {}
        self._cgroups: dict[str, cgroups.AttemptCgroup] = {}
        """Attempt id -> its cgroup, while its container may run (what `sample` reads)."""
        self._digests: dict[str, str] = {}
        """Attempt id -> the digest of the image it runs, once acquired (its isolation note and JobStarted)."""
        self._starting = asyncio.Lock()
        self._started = False
        self._runc: Runc | None = None
        self._keeper: Keeper | None = None
        self._hierarchies: cgroups.Hierarchies | None = None
        self._layers: dict[int, str] = {}  # scratch filesystem (device) -> how its attempts' layers are made
        self._network: network.Plan | None = None
        self._slots: slots.Slots | None = None
        """The worker's attempt networks, kept for the next attempt (made with the bridges)."""
        self._network_why_not = ""  # why the worker's bridges could not be made, if so

    # -- the host ---------------------------------------------------------------------------------

    def host_refusals(self) -> list[str]:
        """Why this machine cannot run the OCI runtime at all; empty if it can (and, once started, without
        looking again: the look reads the host's mounts, some milliseconds, and each job is checked)."""
        return [] if self._started else host_refusals(self.config.container_runtime)

    async def start(self) -> list[str]:
        """Take the worker's name on this host and clean up what a dead worker left (this one's
        predecessor, or any other gone); `run` does it on first use. Returns what could not be cleaned
        (logged too). Raises AttemptFailed if the runtime cannot run here."""
        async with self._starting:
            if self._started:
                return []
            if refusals := self.host_refusals():
                raise AttemptFailed("the OCI runtime", "; ".join(refusals))
            binary, _ = choose(self.config.container_runtime)
            assert binary is not None
            hierarchies = cgroups.Hierarchies.of_host()
            try:
                await asyncio.to_thread(self.owner.claim)
            except (OwnerBusy, OSError) as e:
                raise AttemptFailed("the OCI runtime", str(e)) from e
            left = await clean_up(self.owner, hierarchies)
            left += await clean_up_dead_owners(self.config.state_root, self.config.cgroup_root, hierarchies,
                                               alive=self.config.owner)
            for what in left:
                logger.warning("OCI runtime %s: could not clean up %s", self.config.owner, what)
            worker = worker_cgroup.WorkerCgroup(hierarchies, self.config.cgroup_root, self.config.deployment,
                                                self.config.owner)
            deployment_max = (self.config.deployment_max_processes
                              or default_deployment_max_processes(worker_cgroup.host_pid_max()))
            try:
                await asyncio.to_thread(worker.create, self.max_processes, deployment_max)
            except cgroups.CgroupError as e:
                raise AttemptFailed("the OCI runtime", str(e)) from e
            await self._set_up_network()
            self._worker_cgroup = worker
            runtime = Runc(binary, self.owner.runtime_root(kind_of(binary)))
            runtime.root.mkdir(mode=0o700, exist_ok=True)
            self._runc, self._hierarchies, self._started = runtime, hierarchies, True
            return left

    async def _set_up_network(self) -> None:
        """The bridges and chains of private and public networks; where they cannot be made, jobs that ask for
        them are refused saying why (NETWORK_MODE_NONE needs none of it)."""
        self._network, self._slots, self._network_why_not = None, None, ""
        if not self.config.offers_networks:
            self._network_why_not = "this runtime offers no network but loopback (offers_networks is off)"
            return
        if why_not := network.host_refusals():
            self._network_why_not = "; ".join(why_not)
            return
        host = network.HostNetwork(self.config.state_root, self.owner.dir, self.config.owner,
                                   self.config.private_networks)
        try:
            self._network = await asyncio.to_thread(host.set_up)
            self._slots = slots.Slots(self._network)
        except (network.NetworkError, OSError) as e:
            self._network_why_not = f"the worker's bridges could not be made: {e}"
            logger.warning("OCI runtime %s: %s", self.config.owner, self._network_why_not)
            for what in await asyncio.to_thread(host.tear_down):
                logger.warning("OCI runtime %s: could not clean up %s", self.config.owner, what)

    async def close(self) -> None:
        """Remove the worker's cgroup parent and state and let its name go, once no attempt runs."""
        async with self._starting:
            if not self._started or self._stops:
                return
            assert self._runc is not None and self._hierarchies is not None
            if self._keeper is not None:
                await asyncio.to_thread(self._keeper.close)
                self._keeper = None
            left = await clean_up(self.owner, self._hierarchies)
            for what in left:
                logger.warning("OCI runtime %s: could not clean up %s", self.config.owner, what)
            self._worker_cgroup = None  # clean_up removed it, and the deployment's if it was the last
            if self._slots is not None:
                self._slots.close()
            self._network = self._slots = None  # clean_up removed the attempts' networks and the bridges
            if not left:
                await asyncio.to_thread(self.owner.release)
                self._started = False

    # -- ContainerRuntime -------------------------------------------------------------------------

    def check(self, spec: job_spec_pb2.JobSpec) -> list[str]:
        """See `ContainerRuntime.check`."""
        return self.host_refusals() + oci_refusals(spec) + self._network_refusals(spec)

    def _network_refusals(self, spec: job_spec_pb2.JobSpec) -> list[str]:
        if spec.network_mode == job_spec_pb2.NETWORK_MODE_NONE:
            return []
        if self._started:  # the bridges were tried: the reason, if any, is known
            why_not = [self._network_why_not] if self._network_why_not else []
        else:
            why_not = network.host_refusals() or ([self._network_why_not] if self._network_why_not else [])
        mode = job_spec_pb2.NetworkMode.Name(spec.network_mode)
        return [f"network_mode {mode} cannot be offered on this host: {why}" for why in why_not]

    @property
    def container_runtime(self) -> str:
        """What runs the containers: crun or runc, once started."""
        return self._runc.kind if self._runc is not None else "crun or runc"

    def attempt_max_processes(self, job: JobRun) -> int:
        """The attempt's pids.max: its cores' share of the worker's cap, at most `max_processes`."""
        return attempt_max_processes(job.cores_mcpu, self.cores_mcpu, self.max_processes, self.config.max_processes)

    def isolation(self, job: JobRun) -> str:
        """See `ContainerRuntime.isolation`."""
        image = f"{job.spec.image!r}" + (f" ({digest})" if (digest := self._digests.get(job.attempt_id)) else "")
        return (f"OCI container ({self.container_runtime}) of the image {image} on a writable layer of its own; as "
                "a uid of its own, never root, with no capabilities, no_new_privs and a seccomp filter; its own PID, "
                f"mount, IPC, UTS and cgroup namespaces and {self._network_words(job.spec)}; cgroup limits: "
                f"{job.cores_mcpu / 1000:g} cores, {self._memory_limit(job)} bytes of memory with no swap, "
                f"{self.attempt_max_processes(job)} processes and threads (its worker's {self.max_processes} "
                f"shared out by cores); {self._storage_words(job)}. Shared with the host: the kernel.")

    def image_digest(self, job: JobRun) -> str:
        """See `ContainerRuntime.image_digest`."""
        return self._digests.get(job.attempt_id, "")

    def _storage_words(self, job: JobRun) -> str:
        if job.storage_bytes <= 0:
            return "its writes go to the worker's scratch disk, not limited in size (it reserved no storage)"
        return (f"its writes go to the worker's scratch disk, at most its storage request of "
                f"{binary_size(job.storage_bytes)} (measured every {self.config.storage_check_interval_s:g} s, "
                "and each file held to that size)")

    def _network_words(self, spec: job_spec_pb2.JobSpec) -> str:
        mode = _network_mode(spec)
        if mode is None:
            return "a network namespace with only loopback"
        ranges = ", ".join(str(n) for n in self.config.private_networks) or "none"
        if mode == network.PUBLIC:
            return ("a network namespace of its own on the worker's public bridge, NATed to the host's networks: "
                    f"not to the host itself, link-local addresses or the deployment's private ranges ({ranges})")
        return ("a network namespace of its own on the worker's private bridge, reaching only the deployment's "
                f"private ranges ({ranges})")

    def sample(self, attempt_id: str) -> UsageReading | None:
        """See `ContainerRuntime.sample`: the attempt's cgroup counters."""
        cgroup = self._cgroups.get(attempt_id)
        if cgroup is None:
            return None
        usage = cgroup.usage()
        return UsageReading(cpu_time_ms=usage.cpu_time_ms, memory_bytes=usage.memory_bytes,
                            peak_memory_bytes=usage.peak_memory_bytes, io_read_bytes=usage.io_read_bytes,
                            io_write_bytes=usage.io_write_bytes)

    async def cancel(self, attempt_id: str) -> None:
        """Ask the attempt to stop: SIGTERM to all its processes, SIGKILL after `kill_grace_s`."""
        if (stop := self._stops.get(attempt_id)) is not None:
            stop.set()

    async def run(self, job: JobRun, log: LogSink, on_started: Callable[[int], Awaitable[None]]) -> JobOutcome:
        """See `ContainerRuntime.run`."""
        if job.attempt_id in self._stops:
            raise ValueError(f"attempt {job.attempt_id} is already running")
        self._stops[job.attempt_id] = stop = asyncio.Event()
        attempt = _Attempt(job)
        try:
            if refusals := self.check(job.spec):
                return self._outcome(job, "Error", REFUSED,
                                     "the OCI runtime cannot run this job: " + "; ".join(refusals))
            try:
                await self.start()
                if refusals := self._network_refusals(job.spec):  # known once the worker's bridges are tried
                    return self._outcome(job, "Error", REFUSED,
                                         "the OCI runtime cannot run this job: " + "; ".join(refusals))
                return await self._run(attempt, log, on_started, stop)
            except AttemptRefused as e:
                return self._outcome(job, "Error", REFUSED, str(e), start_ms=attempt.start_ms)
            except AttemptFailed as e:
                words = f"{ran_out(job.attempt_dir)}: {e}" if out_of_space(e) else str(e)
                return self._outcome(job, "Error", SYSTEM_ERROR, words, start_ms=attempt.start_ms)
        finally:
            log.close()
            self._digests.pop(job.attempt_id, None)
            try:
                await asyncio.shield(asyncio.ensure_future(self._teardown(attempt)))
            finally:
                self._stops.pop(job.attempt_id, None)

    # -- one attempt ------------------------------------------------------------------------------

    async def _run(self, attempt: _Attempt, log: LogSink, on_started: Callable[[int], Awaitable[None]],
                   stop: asyncio.Event) -> JobOutcome:
        job = attempt.job
        assert self._runc is not None and self._hierarchies is not None
        if not _ID.fullmatch(job.attempt_id):
            raise AttemptFailed("attempt", f"attempt id {job.attempt_id!r} cannot name a container")
        attempt.claim = await self._claim_uid()
        uid = gid = attempt.claim.uid
        attempt.container_id = f"{self.config.owner}-{job.batch_id}-{job.job_id}-{job.attempt_id}"
        attempt.cgroup_path = f"{self.owner.cgroup_parent}/{job.batch_id}-{job.job_id}-{job.attempt_id}"
        oci_dir = Path(os.path.realpath(job.scratch)) / job.attempt_dir.name / "oci"
        self.owner.record(AttemptRecord(attempt.container_id, str(oci_dir), attempt.cgroup_path))
        attempt.recorded = True  # before anything it names is made
        try:
            attempt.oci_dir = await asyncio.to_thread(layer.make_attempt_dir, oci_dir)
        except layer.LayerError as e:
            raise AttemptFailed("attempt directory", str(e)) from e

        try:
            rootfs = await self.config.rootfs.acquire(job.spec.image, job.pull_credentials)
        except ImageUnavailable as e:
            if e.final:  # the registry said no: the job's image or login, which no other worker changes
                raise AttemptRefused("image", f"could not get {job.spec.image!r}: {e}") from e
            raise AttemptFailed("image", f"could not get {job.spec.image!r}: {e}") from e
        except Exception as e:  # noqa: BLE001 - whatever the source raises, its words are the reason
            raise AttemptFailed("image", f"could not get {job.spec.image!r}: {e}") from e
        attempt.rootfs = rootfs
        self._digests[job.attempt_id] = rootfs.digest  # what ran, in the attempt's isolation note
        kind = await self._layer_kind(attempt.oci_dir)
        try:
            root = await layer.make_root(rootfs.path, attempt.oci_dir, kind)
        except (layer.LayerError, OSError) as e:
            raise AttemptFailed("root filesystem", str(e)) from e
        cwd = rootfs.config.working_dir or WORK_DIR
        if path_refusals("working directory", cwd) and cwd != "/":
            raise AttemptFailed("image", f"the image's working directory {cwd!r} is not an absolute path without '..'")
        await self._fill(attempt, root, cwd, uid, gid)
        binds = await self._secrets(attempt, uid, gid) + await self._network_of(attempt)

        cgroup = cgroups.AttemptCgroup(self._hierarchies, attempt.cgroup_path)  # made below, with the bundle
        container = Container(
            argv=tuple(job.spec.argv.args) if job.spec.WhichOneof("command") == "argv" else
            ("/bin/sh", "-c", job.spec.script),
            env=merged_env({"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": WORK_DIR},
                           rootfs.config.env, dict(job.spec.env),
                           {"CORRAL_BATCH_ID": str(job.batch_id), "CORRAL_JOB_ID": str(job.job_id),
                            "CORRAL_ATTEMPT_ID": job.attempt_id}),
            cwd=cwd, uid=uid, gid=gid, hostname=f"job-{job.batch_id}-{job.job_id}",
            cgroups_path=cgroup.runc_path, shm_bytes=self.config.shm_bytes,
            network_namespace=attempt.network.netns_path if attempt.network else "",
            max_open_files=_open_files_limit(self.config.max_open_files), max_file_bytes=max(0, job.storage_bytes),
            read_only_binds=binds,
            annotations=(("corral.owner", self.config.owner), ("corral.attempt", job.attempt_id)))
        limits = cgroups.Limits(job.cores_mcpu, self._memory_limit(job), self.attempt_max_processes(job))

        def cgroup_and_bundle() -> None:  # one hop to a thread for both
            try:
                attempt.cgroup = cgroups.AttemptCgroup.create(self._hierarchies, attempt.cgroup_path, limits)
            except cgroups.CgroupError as e:
                raise AttemptFailed("cgroup", str(e)) from e
            try:
                layer.write_private(attempt.oci_dir / "config.json", json.dumps(config_json(container)).encode())
            except OSError as e:
                raise AttemptFailed("bundle", f"could not write config.json: {e}") from e

        try:
            await asyncio.to_thread(cgroup_and_bundle)
        finally:
            if attempt.cgroup is not None:
                self._cgroups[job.attempt_id] = attempt.cgroup
        if stop.is_set():
            return self._outcome(job, "Cancelled", CANCELLED, "cancelled before the command started")
        attempt.limits = attempt_limits.AttemptLimits(
            attempt.cgroup, max(0, job.storage_bytes),
            (attempt.oci_dir / "upper",) if kind == layer.OVERLAY else (root,),
            None if kind == layer.OVERLAY else uid, "its container was killed",
            self.config.process_check_interval_s, self.config.storage_check_interval_s, job.cores_mcpu,
            self.cores_mcpu)
        return await self._contain(attempt, root, log, on_started, stop, uid)

    async def _fill(self, attempt: _Attempt, root: Path, cwd: str, uid: int, gid: int) -> None:
        """The job's directories in its root filesystem, and its inputs."""
        job = attempt.job

        def fill() -> None:
            root_fd = layer.open_root(root)
            try:
                layer.ensure_dir(root_fd, "/tmp", 0o1777)
                layer.ensure_dir(root_fd, WORK_DIR, 0o700, owner=(uid, gid))
                if cwd not in (WORK_DIR, "/"):
                    layer.ensure_dir(root_fd, cwd, 0o755)
            finally:
                os.close(root_fd)

        try:
            await asyncio.to_thread(fill)
        except (layer.LayerError, OSError) as e:
            raise AttemptFailed("root filesystem", str(e)) from e
        if not job.spec.input_files:
            return  # each hop to a thread costs the worker some 0.3 ms of CPU: none for nothing
        try:
            made = await asyncio.to_thread(copy_inputs, job.spec, root, self.config.check_url,
                                           stores=self.config.object_stores)
            await asyncio.to_thread(layer.give_paths, root, made, uid, gid)
        except Exception as e:
            raise AttemptFailed("input files", f"copying input files failed: {e}") from e

    async def _secrets(self, attempt: _Attempt, uid: int, gid: int) -> tuple[tuple[str, str], ...]:
        """Copies of the job's secrets for its uid, and where each is mounted."""
        job = attempt.job
        given = {m.mount_path for m in job.secrets}
        missing = [s.name for s in job.spec.secrets if s.mount_path not in given]
        if missing:
            raise AttemptFailed("secrets", f"the worker was not given the secrets {', '.join(missing)}")
        if not job.secrets:
            return ()
        try:
            copies = await asyncio.to_thread(layer.stage_secrets, attempt.oci_dir / "secrets",
                                             [m.files for m in job.secrets], uid, gid)
        except (layer.LayerError, OSError) as e:
            raise AttemptFailed("secrets", str(e)) from e
        return tuple((str(copy), m.mount_path) for copy, m in zip(copies, job.secrets))

    async def _network_of(self, attempt: _Attempt) -> tuple[tuple[str, str], ...]:
        """The attempt's network namespace for a private or public network (attempt.network), and the
        resolv.conf to mount, if any."""
        mode = _network_mode(attempt.job.spec)
        if mode is None:
            return ()
        if self._slots is None:
            raise AttemptFailed("network", self._network_why_not or "the worker has no bridges")
        try:
            attempt.network = await self._slots.acquire(mode)
        except (network.NetworkError, OSError) as e:
            raise AttemptFailed("network", str(e)) from e
        try:
            host_conf = Path("/etc/resolv.conf").read_text()
        except OSError:
            host_conf = ""
        servers = network.resolvers(host_conf, mode, self.config.private_networks)
        if not servers:
            return ()
        assert attempt.oci_dir is not None
        conf = attempt.oci_dir / "resolv.conf"
        try:
            fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            os.fchmod(fd, 0o644)  # the job's uid reads it
            with os.fdopen(fd, "w") as f:
                f.write("".join(f"nameserver {s}\n" for s in servers))
        except OSError as e:
            raise AttemptFailed("network", f"could not write resolv.conf: {e}") from e
        return ((str(conf), "/etc/resolv.conf"),)

    async def _contain(self, attempt: _Attempt, root: Path, log: LogSink,
                       on_started: Callable[[int], Awaitable[None]], stop: asyncio.Event, uid: int) -> JobOutcome:
        """Run the container, its output into `log`, to its end; read what it used; copy its outputs."""
        assert self._runc is not None and attempt.cgroup is not None and attempt.oci_dir is not None
        job, oci_dir = attempt.job, attempt.oci_dir
        runc_log, pid_file = oci_dir / "runtime.log", oci_dir / "pid"
        read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
        pipe = None
        kind = self._runc.kind
        try:
            try:
                runc = await self._kept().run(self._runc, attempt.container_id, oci_dir, runc_log, pid_file,
                                              write_fd)
            except RuncError as e:
                raise AttemptFailed(kind, str(e)) from e
            finally:
                os.close(write_fd)
            attempt.runc = runc
            pipe = await LogPipe.attach(read_fd, log)
            read_fd = -1
            timeout_s = attempt_timeout_s(job.spec, self.config.max_timeout_s)
            try:
                async with asyncio.timeout(self.config.start_timeout_s):
                    running = await wait_until_running(runc, pid_file)
            except TimeoutError:
                raise AttemptFailed(kind, f"the container did not start in {self.config.start_timeout_s:g} s "
                                    f"({kind} is stuck); it was killed") from None
            if running:
                attempt.start_ms = self.config.clock_ms()
                await on_started(1)
                ending = await self._supervise(attempt, stop, timeout_s)
            else:
                await runc.wait()
                ending = None
            await pipe.drain(self.config.output_drain_s)
        finally:
            if read_fd >= 0:
                os.close(read_fd)
            if pipe is not None:
                pipe.close()
        log.close()
        started = pid_file.exists()
        code = runc.returncode
        assert code is not None
        message = f"exited with code {code}"
        if 128 < code < 128 + 65:
            message = f"killed by {signal_name(code - 128)} (exit code {code})"
        cgroup, limits = attempt.cgroup, attempt.limits
        read_limits = started and ending is None and limits is not None  # the runtime's cgroup is still there

        def readings() -> tuple[cgroups.Usage, bool, tuple[str, str] | None]:  # one hop to a thread
            return (cgroup.usage(), cgroup.out_of_memory(),
                    limits.at_end(code, message) if read_limits and limits is not None else None)

        usage, out_of_memory, at_a_limit = await asyncio.to_thread(readings)

        def outcome(state: str, reason: str, message: str, exit_code: int | None = None) -> JobOutcome:
            return self._outcome(job, state, reason, message, exit_code=exit_code, start_ms=attempt.start_ms,
                                 usage=usage if started else None)

        async def failed(reason: str, message: str, exit_code: int | None = None) -> JobOutcome:
            message += await copy_outputs_after_failure(job.spec, root, uid, self.config.check_url,
                                                        stores=self.config.object_stores)
            return outcome("Failed", reason, message, exit_code)

        if ending == CANCELLED:
            return outcome("Cancelled", CANCELLED, "cancelled while running; its container was killed")
        if ending == TIMED_OUT:
            return await failed(TIMED_OUT, f"timed out after {timeout_s:g} s; its container was killed")
        if ending == OVER_LIMIT:
            return await failed(EXITED, attempt.over_limit, code)
        if not started:
            words = last_error(runc_log) or f"{kind} exited with code {code}"
            return outcome("Error", SYSTEM_ERROR, f"the container did not start: {words}")
        if at_a_limit is not None and (code == 0 or not out_of_memory):
            state, words = at_a_limit
            if state == "Failed":
                return await failed(EXITED, words, code)
            return outcome(state, SYSTEM_ERROR, words, code)
        if code == 0:
            try:
                await asyncio.to_thread(copy_outputs, job.spec, root, uid, self.config.check_url,
                                        stores=self.config.object_stores)
            except Exception as e:  # noqa: BLE001 - any copy failure is the system's, said with its reason
                return outcome("Error", SYSTEM_ERROR, f"copying output files failed: {e}", 0)
            return outcome("Success", EXITED, "", 0)
        if out_of_memory:
            return await failed(OUT_OF_MEMORY, f"ran out of memory: the kernel killed a process of the job at its "
                                f"cgroup's limit of {self._memory_limit(job)} bytes; the command {message}", code)
        if is_full(oci_dir) or reports_out_of_space(log.recent):
            return outcome("Error", SYSTEM_ERROR, f"{ran_out(oci_dir)}; the command {message}", code)
        return await failed(EXITED, message, code)

    async def _supervise(self, attempt: _Attempt, stop: asyncio.Event, timeout_s: float | None) -> str | None:
        """Wait for runc to exit, a cancel, the timeout or a limit passed; stop the container in the last
        three cases (a limit passed: at once, with SIGKILL). Returns CANCELLED, TIMED_OUT, OVER_LIMIT or None
        (it exited by itself)."""
        assert attempt.runc is not None and self._runc is not None and attempt.limits is not None
        exited = asyncio.ensure_future(attempt.runc.wait())
        stopped = asyncio.ensure_future(stop.wait())
        over = asyncio.ensure_future(attempt.limits.watch().run())
        try:
            done, _ = await asyncio.wait({exited, stopped, over}, timeout=timeout_s,
                                         return_when=asyncio.FIRST_COMPLETED)
            if exited in done:
                return None
            if over in done:
                attempt.over_limit = over.result()
                await self._signal(attempt, "KILL")
                await exited
                return OVER_LIMIT
            await self._signal(attempt, "TERM")
            if not (await asyncio.wait({exited}, timeout=self.config.kill_grace_s))[0]:
                await self._signal(attempt, "KILL")
                await exited
            return CANCELLED if stopped in done else TIMED_OUT
        finally:
            exited.cancel()
            stopped.cancel()
            over.cancel()

    async def _signal(self, attempt: _Attempt, which: str) -> None:
        assert self._runc is not None
        try:
            await self._runc.kill(attempt.container_id, which)
        except RuncError as e:
            logger.warning("could not send SIG%s to container %s: %s", which, attempt.container_id, e)

    async def _teardown(self, attempt: _Attempt) -> None:
        """Undo everything the attempt made, whatever happened; what cannot be undone stays recorded for
        the next start (and is logged)."""
        left = []
        if attempt.runc is not None and attempt.runc.returncode is None:  # our task was cancelled meanwhile
            await self._signal(attempt, "KILL")
            try:
                async with asyncio.timeout(self.config.kill_grace_s):
                    await attempt.runc.wait()
            except TimeoutError:
                attempt.runc.kill_runtime()  # stuck itself: the keeper then reaps it and says so
                await attempt.runc.wait()
        if self._runc is not None and attempt.container_id and (self._runc.root / attempt.container_id).exists():
            # A detached container (runc's) stays, stopped, until deleted (its cgroup with it, read by now);
            # crun deletes its own as it exits, unless it was killed before.
            try:
                await self._runc.delete(attempt.container_id)
            except RuncError as e:
                left.append(str(e))
        if attempt.network is not None and self._slots is not None:  # kept for the next attempt if clean
            left += await self._slots.release(attempt.network, reusable=not left)
        if attempt.cgroup is not None:
            self._cgroups.pop(attempt.job.attempt_id, None)
            attempt.cgroup.close()
        hierarchies, cgroup_path, oci_dir = self._hierarchies, attempt.cgroup_path, attempt.oci_dir

        def remove() -> list[str]:  # one hop to a thread for both
            not_removed = []
            if cgroup_path and hierarchies is not None:
                not_removed += cgroups.remove_tree(hierarchies, cgroup_path)
            if oci_dir is not None:
                try:
                    layer.remove_oci_dir(oci_dir)
                except OSError as e:
                    not_removed.append(f"{oci_dir}: {e}")
            return not_removed

        left += await asyncio.to_thread(remove)
        if attempt.rootfs is not None:
            try:
                await self.config.rootfs.release(attempt.rootfs)
            except Exception as e:  # noqa: BLE001 - the source's trouble; the attempt is over either way
                logger.warning("could not release the image %s: %s", attempt.rootfs.image, e)
        if attempt.claim is not None:
            attempt.claim.release(clean=not left and bool(attempt.cgroup_path))
        if left:
            for what in left:
                logger.warning("attempt %s: could not clean up %s", attempt.container_id, what)
        elif attempt.recorded:
            self.owner.forget(attempt.container_id)

    # -- helpers ----------------------------------------------------------------------------------

    def _kept(self) -> Keeper:
        """The worker's keeper, started anew if it is gone (from the event loop's thread: it dies with it)."""
        if self._keeper is None or not self._keeper.alive:
            if self._keeper is not None:
                self._keeper.discard()
            self._keeper = Keeper.start()
        return self._keeper

    def _memory_limit(self, job: JobRun) -> int:
        """The job's memory limit: what it reserved, else the worker's memory per core for its cores
        (never 'no limit')."""
        if job.memory_bytes > 0:
            return job.memory_bytes
        return max(1, job.cores_mcpu) * self.config.memory_per_core_bytes // 1000

    async def _layer_kind(self, oci_dir: Path) -> str:
        if self.config.layer != "auto":
            return self.config.layer
        key = os.stat(oci_dir).st_dev
        if key not in self._layers:
            why_not = await asyncio.to_thread(layer.overlay_works, oci_dir)
            self._layers[key] = layer.OVERLAY if not why_not else layer.COPY
            if why_not:
                logger.warning("overlayfs cannot be mounted on the scratch filesystem of %s (%s): each attempt "
                               "gets a copy of its image instead", oci_dir, why_not)
        return self._layers[key]

    async def _claim_uid(self) -> UidClaim:
        """A uid of its own (the claim looks through /proc: in a thread); released if we are cancelled."""
        claiming = asyncio.ensure_future(asyncio.to_thread(self._uids.claim))
        try:
            return await asyncio.shield(claiming)
        except asyncio.CancelledError:
            claiming.add_done_callback(
                lambda f: f.cancelled() or f.exception() is not None or f.result().release())
            raise
        except NoFreeUid as e:
            raise AttemptFailed("uid", str(e)) from e

    def _outcome(self, job: JobRun, state: str, reason: str, message: str, *, exit_code: int | None = None,
                 start_ms: int | None = None, usage: cgroups.Usage | None = None) -> JobOutcome:
        return JobOutcome(
            state=state, exit_code=exit_code, error_message=message, start_time_ms=start_ms,
            end_time_ms=self.config.clock_ms(), end_reason=reason, isolation=self.isolation(job),
            peak_memory_bytes=None if usage is None else usage.peak_memory_bytes,
            cpu_time_ms=None if usage is None else usage.cpu_time_ms,
            io_read_bytes=None if usage is None else usage.io_read_bytes,
            io_write_bytes=None if usage is None else usage.io_write_bytes)


@dataclass
class _Attempt:
    """What one attempt has made so far (for `_teardown`)."""

    job: JobRun
    claim: UidClaim | None = None
    container_id: str = ""
    cgroup_path: str = ""
    oci_dir: Path | None = None
    recorded: bool = False
    rootfs: Rootfs | None = None
    cgroup: cgroups.AttemptCgroup | None = None
    runc: KeptContainer | None = None
    start_ms: int | None = None
    network: slots.Slot | None = None
    limits: attempt_limits.AttemptLimits | None = None
    """What its limit watch reads, once its container is about to run."""
    over_limit: str = ""
    """Why the limit watch killed it, if it did."""


def _network_mode(spec: job_spec_pb2.JobSpec) -> str | None:
    """network.PUBLIC (the default), network.PRIVATE, or None for NETWORK_MODE_NONE."""
    if spec.network_mode == job_spec_pb2.NETWORK_MODE_NONE:
        return None
    return network.PRIVATE if spec.network_mode == job_spec_pb2.NETWORK_MODE_PRIVATE else network.PUBLIC


def _open_files_limit(wanted: int) -> int:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
