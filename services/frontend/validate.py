"""Checking job specs and turning them into rows for `insert_jobs`.

Pure functions over protos: every problem of a bunch is reported at once as
field violations (`jobs[3].parents[0].job_id`), and nothing is written
unless the whole bunch is valid. The database re-checks what only it can
(parents in earlier updates, known regions and pools).
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
import re
from collections.abc import Collection, Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any, NamedTuple

from corral.batch.v1 import job_spec_pb2 as spec_pb
from corral.batch.v1 import job_state_pb2
from services.common.fields import FieldViolation
from services.frontend.limits import Limits
from services.frontend.url_checks import file_url_violations
from services.policy.runnable import Deployment, InstanceCollection, Needs, never_runs, oversize

DEFAULT_CORES_MCPU = 1_000
GIB = 1024**3

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SECRET_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
"""A secret's name, within its billing project: the billing project names' rule."""
SECRET_NAME_RULE = "1-64 characters: lower-case letters, digits, '-', '_', starting with a letter or digit"
SECRET_FILE_NAME = re.compile(r"^[A-Za-z0-9._-]{1,100}$")
"""A file of a secret ('.' and '..' excepted): one path component, in any filesystem."""
SECRET_FILE_RULE = "a file name: 1-100 letters, digits, '.', '-', '_' (not '.' or '..')"
_ACCEPTED_BITS = {
    job_state_pb2.JOB_STATE_SUCCEEDED: 1,
    job_state_pb2.JOB_STATE_FAILED: 2,
    job_state_pb2.JOB_STATE_ERROR: 4,
    job_state_pb2.JOB_STATE_CANCELLED: 8,
}
_LOCK_MODES = {
    spec_pb.LOCK_MODE_SHARED: "shared",
    spec_pb.LOCK_MODE_UNKNOWN_SHARED: "unknown_shared",
    spec_pb.LOCK_MODE_ALL_SHARED: "all_shared",
    spec_pb.LOCK_MODE_EXCLUSIVE: "exclusive",
    spec_pb.LOCK_MODE_UNKNOWN_EXCLUSIVE: "unknown_exclusive",
    spec_pb.LOCK_MODE_ALL_EXCLUSIVE: "all_exclusive",
}
_NAMED_MODES = {spec_pb.LOCK_MODE_SHARED, spec_pb.LOCK_MODE_EXCLUSIVE}

MAX_DURATION_S = 315_576_000_000
"""The largest valid google.protobuf.Duration (10,000 years)."""
MAX_RETRIES = 100
"""Most preemptions before on-demand, and most retries after non-zero exits, a policy may ask for."""
MAX_OOM_FACTOR = 16.0
MAX_RETRY_EXIT_CODES = 64
MAX_RETRY_DELAY_S = 24 * 3600
DEFAULT_RETRY_DELAY_MS = 1_000
DEFAULT_MAX_RETRY_DELAY_MS = 600_000


@dataclasses.dataclass(frozen=True)
class UpdateBlock:
    """The ids an update reserved: jobs [start_job_id, +n_jobs), groups likewise."""

    start_job_id: int
    n_jobs: int
    start_job_group_id: int
    n_job_groups: int


@dataclasses.dataclass(frozen=True)
class PoolMachine:
    """The machine of a pool (instance_collections.worker_cores, worker_memory_bytes, worker_storage_bytes): the
    largest a job of the pool may ask for, and its memory (storage) per core is what a job that asks for no
    memory (storage) gets."""

    cores_mcpu: int
    memory_bytes: int
    storage_bytes: int = 0
    """0: the pool's storage is not known; a job's storage is then neither checked nor given a default."""

    def memory_for(self, cores: int) -> int:
        """The pool's standard memory for `cores` mcpu."""
        return self.memory_bytes * cores // self.cores_mcpu

    def storage_for(self, cores: int) -> int:
        """The pool's standard scratch storage for `cores` mcpu."""
        return self.storage_bytes * cores // self.cores_mcpu


class PoolChoice(NamedTuple):
    """The pool (instance collection) a job runs in, and the cores, memory and scratch storage it takes there.
    (Not what a job reserves of its project's limit: that is `services.policy.planner.Candidate.reserve_micro_usd`.)"""

    cores_mcpu: int
    inst_coll: str
    memory_bytes: int
    storage_bytes: int


def choose_pool(spec: spec_pb.JobSpec, pools: Mapping[str, PoolMachine] | None) -> PoolChoice:
    """The job's pool and size. Its cores: what it asks for, else 1. Its pool: a machine type gets a job-private
    machine, otherwise memory per core picks highcpu, standard or highmem (no memory asked for: standard, the
    protos' promise). Its memory (storage): what it asks for, else its pool's standard amount for its cores, 0
    when the pools (the pool's storage) are not known: a job-private machine's is its machine's."""
    size = spec.WhichOneof("size")
    asked = spec.resources  # all zero unless size is "resources"
    cores = asked.cores_mcpu if size == "resources" and asked.cores_mcpu else DEFAULT_CORES_MCPU
    if size == "machine_type":
        pool = "job-private"
    elif not asked.memory_bytes:
        pool = "standard"
    else:
        memory_per_core = asked.memory_bytes * 1000 / cores
        pool = "highcpu" if memory_per_core <= 1 * GIB else "standard" if memory_per_core <= 4 * GIB else "highmem"
    memory, storage = asked.memory_bytes, asked.storage_bytes
    if not (memory and storage):
        machine = (pools or {}).get(pool)
        if machine is not None:
            memory = memory or machine.memory_for(cores)
            storage = storage or machine.storage_for(cores)
    return PoolChoice(cores, pool, memory, storage)


_LISTS = (("parents", "max_parents_per_job"), ("env", "max_env_per_job"), ("attributes", "max_attributes"),
          ("input_files", "max_files_per_job"), ("output_files", "max_files_per_job"),
          ("regions", "max_regions_per_job"), ("locks", "max_locks_per_job"), ("secrets", "max_secrets_per_job"))
"""A spec's lists (and maps) and the limits on their entries."""


def _list_sizes(spec: spec_pb.JobSpec, present: Collection[str], limits: Limits, at: str) -> list[FieldViolation]:
    """The spec's lists (and maps) against their limits; `present`: the fields the spec sets."""
    v = [FieldViolation(f"{at}.{field}", f"at most {getattr(limits, setting)} entries ({setting})")
         for field, setting in _LISTS if field in present and len(getattr(spec, field)) > getattr(limits, setting)]
    if "locks" in present:
        v += [FieldViolation(f"{at}.locks[{i}].names", f"at most {limits.max_names_per_lock} entries "
                                                        "(max_names_per_lock)")
              for i, lock in enumerate(spec.locks) if len(lock.names) > limits.max_names_per_lock]
    return v


def _check_spec(spec: spec_pb.JobSpec, present: Collection[str], job_id: int, block: UpdateBlock, at: str,
                limits: Limits) -> list[FieldViolation]:
    """What is wrong with one spec on its own; `present`: the fields it sets (a section for a field it does
    not set has nothing to find, and most specs set few)."""
    v = _list_sizes(spec, present, limits, at)
    if v:
        return v  # and look no further into a spec that may be huge
    if not spec.image.strip():
        v.append(FieldViolation(f"{at}.image", "an image is required"))
    command = spec.WhichOneof("command")
    if command is None or (command == "argv" and not spec.argv.args) or (command == "script" and not spec.script):
        v.append(FieldViolation(f"{at}.command", "a command is required (argv or script)"))
    if "resources" in present:
        r = spec.resources
        if not 0 <= r.cores_mcpu <= limits.max_cores_mcpu:
            v.append(FieldViolation(f"{at}.resources.cores_mcpu",
                                    f"must be between 0 and {limits.max_cores_mcpu} (max_cores_mcpu)"))
        if r.memory_bytes < 0:
            v.append(FieldViolation(f"{at}.resources.memory_bytes", "must not be negative"))
        if r.storage_bytes < 0:
            v.append(FieldViolation(f"{at}.resources.storage_bytes", "must not be negative"))
    elif "machine_type" in present and not spec.machine_type.strip():
        v.append(FieldViolation(f"{at}.machine_type", "must not be empty"))
    if "timeout" in present:
        if spec.timeout.seconds < 0 or spec.timeout.nanos < 0:
            v.append(FieldViolation(f"{at}.timeout", "must not be negative"))
        elif spec.timeout.seconds > MAX_DURATION_S or spec.timeout.nanos > 999_999_999:
            # Past a Duration's range job_row could not convert it: refused here, before anything is written.
            v.append(FieldViolation(f"{at}.timeout", f"at most {MAX_DURATION_S:,} s (a protobuf Duration's range)"))
    if spec.max_attempts < 0:
        v.append(FieldViolation(f"{at}.max_attempts", "must not be negative (0 means the default)"))
    if "env" in present:
        for name in spec.env:
            if not _ENV_NAME.match(name):
                v.append(FieldViolation(f"{at}.env", f"{name!r} is not a valid variable name"))
    if "regions" in present:
        for i, region in enumerate(spec.regions):
            if not region.strip():
                v.append(FieldViolation(f"{at}.regions[{i}]", "must not be empty"))
    if "locks" in present:
        v += _lock_violations(spec, at)
    if "job_group" in present:
        ref = spec.job_group.WhichOneof("ref")
        if ref == "job_group_id" and spec.job_group.job_group_id < 0:
            v.append(FieldViolation(f"{at}.job_group.job_group_id", "must not be negative"))
        if ref == "in_update_index" and not 0 <= spec.job_group.in_update_index < block.n_job_groups:
            v.append(FieldViolation(f"{at}.job_group.in_update_index",
                                    f"the update has {block.n_job_groups} job groups"))
    if "parents" in present:
        v += _parent_violations(spec, job_id, block, at)
    if "retry_policy" in present:
        v += retry_policy_violations(spec.retry_policy, f"{at}.retry_policy")
    if "secrets" in present:
        v += _secret_mount_violations(spec, at)
    if spec.image_pull_secret and secret_reference(spec.image_pull_secret) is None:
        v.append(FieldViolation(f"{at}.image_pull_secret", f"a secret's name ({SECRET_NAME_RULE}), or PROJECT/NAME"))
    if spec.ByteSize() > limits.max_spec_bytes:
        v.append(FieldViolation(at, f"the spec is larger than {limits.max_spec_bytes} bytes (max_spec_bytes)"))
    return v


def _lock_violations(spec: spec_pb.JobSpec, at: str) -> list[FieldViolation]:
    v = []
    for i, lock in enumerate(spec.locks):
        if not lock.level:
            v.append(FieldViolation(f"{at}.locks[{i}].level", "a lock names its level"))
        if lock.mode not in _LOCK_MODES and lock.mode != spec_pb.LOCK_MODE_NONE:
            v.append(FieldViolation(f"{at}.locks[{i}].mode", "unknown lock mode"))
        elif (lock.mode in _NAMED_MODES) != bool(lock.names):
            v.append(FieldViolation(f"{at}.locks[{i}].names", "shared and exclusive locks (only) name resources"))
        elif not all(lock.names):
            v.append(FieldViolation(f"{at}.locks[{i}].names", "a resource name must not be empty"))
    levels = [lock.level for lock in spec.locks]
    for i, level in enumerate(levels):
        if level and level in levels[:i]:
            v.append(FieldViolation(f"{at}.locks[{i}].level", f"level {level!r} is locked twice: one entry per "
                                                              "level, with every name it needs"))
    return v


def _parent_violations(spec: spec_pb.JobSpec, job_id: int, block: UpdateBlock, at: str) -> list[FieldViolation]:
    v = []
    named: dict[int, int] = {}  # parent id -> the first parents[] entry naming it
    for i, parent in enumerate(spec.parents):
        where = f"{at}.parents[{i}]"
        kind = parent.WhichOneof("ref")
        if kind is None:
            v.append(FieldViolation(where, "a parent names job_id or in_update_offset"))
        elif kind == "job_id" and not 1 <= parent.job_id < job_id:
            v.append(FieldViolation(f"{where}.job_id", f"must be at least 1 and smaller than the job's id {job_id}"))
        elif kind == "in_update_offset" and not (parent.in_update_offset < 0
                                                 and job_id + parent.in_update_offset >= block.start_job_id):
            v.append(FieldViolation(f"{where}.in_update_offset",
                                    "must be negative and point inside the same update"))
        else:
            parent_id = parent.job_id if kind == "job_id" else job_id + parent.in_update_offset
            if parent_id in named:
                v.append(FieldViolation(where, f"names job {parent_id}, as parents[{named[parent_id]}] does"))
            named.setdefault(parent_id, i)
        for state in parent.accepted_states:
            if state not in _ACCEPTED_BITS:
                v.append(FieldViolation(f"{where}.accepted_states",
                                        "only final states: SUCCEEDED, FAILED, ERROR, CANCELLED"))
                break
    return v


def secret_file_name_ok(name: str) -> bool:
    """Whether `name` may name a file of a secret."""
    return bool(SECRET_FILE_NAME.match(name)) and name not in (".", "..")


def secret_reference(name: str) -> tuple[str, str] | None:
    """A SecretMount's name as (project, secret): 'NAME' has project '' (the batch's), 'PROJECT/NAME' names
    its project; None if it is neither."""
    project, _, secret = name.rpartition("/")
    if not SECRET_NAME.match(secret) or (project and not SECRET_NAME.match(project)):
        return None
    return project, secret


def _container_path(path: str) -> PurePosixPath | None:
    """An absolute path below / with no empty, '.' or '..' segment, as written; None otherwise."""
    if not path.startswith("/") or "\0" in path or path == "/":
        return None
    parts = path[1:].rstrip("/").split("/")
    if any(part in ("", ".", "..") for part in parts):
        return None
    return PurePosixPath(path)


def _overlap(a: PurePosixPath, b: PurePosixPath) -> bool:
    return a == b or a in b.parents or b in a.parents


def _secret_mount_violations(spec: spec_pb.JobSpec, at: str) -> list[FieldViolation]:
    """Each secret is named well and mounted where nothing else of the job is: not on another secret, not
    on or under an input's or output's path (an output there would copy the secret out to storage)."""
    v = []
    files = [(f"input_files[{k}].to_path", f.to_path) for k, f in enumerate(spec.input_files)]
    files += [(f"output_files[{k}].from_path", f.from_path) for k, f in enumerate(spec.output_files)]
    others = [(field, PurePosixPath(posixpath.normpath(path))) for field, path in files if path.startswith("/")]
    for j, mount in enumerate(spec.secrets):
        where = f"{at}.secrets[{j}]"
        if secret_reference(mount.name) is None:
            v.append(FieldViolation(f"{where}.name", f"a secret's name ({SECRET_NAME_RULE}), or PROJECT/NAME"))
        path = _container_path(mount.mount_path)
        if path is None:
            v.append(FieldViolation(f"{where}.mount_path", "an absolute directory below /, without empty, '.' or "
                                                           "'..' segments"))
            continue
        for field, other in others:
            if _overlap(path, other):
                v.append(FieldViolation(f"{where}.mount_path", f"overlaps {field} {str(other)!r}"))
                break
        others.append((f"secrets[{j}].mount_path", path))
    return v


def retry_policy_violations(policy: spec_pb.RetryPolicy, at: str) -> list[FieldViolation]:
    """What is wrong with a job's or group's retry policy (every bound is in docs/security.md)."""
    v = []
    if not 0 <= policy.max_preemptions_before_on_demand <= MAX_RETRIES:
        v.append(FieldViolation(f"{at}.max_preemptions_before_on_demand", f"must be between 0 and {MAX_RETRIES}"))
    factor = policy.retry_oom_with_memory_factor
    if not (factor == 0 or 1 < factor <= MAX_OOM_FACTOR):
        v.append(FieldViolation(f"{at}.retry_oom_with_memory_factor",
                                f"must be 0 (no retry) or greater than 1 and at most {MAX_OOM_FACTOR:g}"))
    if policy.max_memory_bytes < 0:
        v.append(FieldViolation(f"{at}.max_memory_bytes", "must not be negative"))
    if not 0 <= policy.max_failed_retries <= MAX_RETRIES:
        v.append(FieldViolation(f"{at}.max_failed_retries", f"must be between 0 and {MAX_RETRIES}"))
    if len(policy.retry_exit_codes) > MAX_RETRY_EXIT_CODES:
        v.append(FieldViolation(f"{at}.retry_exit_codes", f"at most {MAX_RETRY_EXIT_CODES} entries"))
    elif not all(1 <= code <= 255 for code in policy.retry_exit_codes):
        v.append(FieldViolation(f"{at}.retry_exit_codes", "exit codes are between 1 and 255"))
    for name in ("retry_delay", "max_retry_delay"):
        delay = getattr(policy, name)
        if delay.seconds < 0 or delay.nanos < 0 or delay.seconds > MAX_RETRY_DELAY_S:
            v.append(FieldViolation(f"{at}.{name}", f"must be between 0 and {MAX_RETRY_DELAY_S} s"))
    return v


def retry_policy_json(policy: spec_pb.RetryPolicy) -> str:
    """The policy as decide_retries reads it (migration 0014), defaults filled in."""
    def ms(field: str, default: int) -> int:
        return round(getattr(policy, field).ToTimedelta().total_seconds() * 1000) if policy.HasField(field) \
            else default
    return json.dumps({
        "max_preemptions_before_on_demand": policy.max_preemptions_before_on_demand,
        "oom_memory_factor": policy.retry_oom_with_memory_factor,
        "max_memory_bytes": policy.max_memory_bytes,
        "max_failed_retries": policy.max_failed_retries,
        "exit_codes": sorted(set(policy.retry_exit_codes)),
        "delay_ms": ms("retry_delay", DEFAULT_RETRY_DELAY_MS),
        "max_delay_ms": ms("max_retry_delay", DEFAULT_MAX_RETRY_DELAY_MS),
    }, separators=(",", ":"))


def pool_machines(deployment: Deployment) -> dict[str, PoolMachine]:
    """Each enabled pool's machine whose size is known: the largest job it takes, its memory and storage per
    core (what `choose_pool` gives a job that asks for none)."""
    return {c.name: PoolMachine(c.cores_mcpu, c.memory_bytes, c.storage_bytes) for c in deployment.pools()
            if c.cores_mcpu > 0 and c.memory_bytes > 0}


def _size_violations(spec: spec_pb.JobSpec, at: str, pools: Mapping[str, PoolMachine]) -> list[FieldViolation]:
    """A job larger than its pool's machine (cores, memory, scratch storage) could never run: refused with the
    machine's size."""
    cores, pool, memory, storage = choose_pool(spec, pools)
    machine = pools.get(pool)
    if machine is None:
        return []
    asked = {"cores_mcpu": True, "memory_bytes": bool(spec.resources.memory_bytes),
             "storage_bytes": bool(spec.resources.storage_bytes)}
    found = oversize(Needs(pool, cores, memory, storage), InstanceCollection(
        pool, True, "", machine.cores_mcpu, machine.memory_bytes, machine.storage_bytes))
    too_wide = any(resource == "cores_mcpu" for resource, _ in found)
    # A default (0) that grew past the machine with the job's cores is the cores' fault, said above.
    return [FieldViolation(f"{at}.resources.{resource}", text) for resource, text in found
            if resource == "cores_mcpu" or not too_wide or asked[resource]]


def _never_runs_violations(spec: spec_pb.JobSpec, at: str, deployment: Deployment,
                           pools: Mapping[str, PoolMachine]) -> list[FieldViolation]:
    """A job no collection of the deployment can ever run (a machine type nobody makes, a pool that is
    disabled or missing): one line on the field at fault. A job too large for its pool's machine is
    `_size_violations`'s, field by field."""
    cores, pool, memory, storage = choose_pool(spec, pools)
    why = never_runs(Needs(pool, cores, memory, storage, spec.machine_type), deployment)
    if why is None or pool in pools:
        return []
    if spec.WhichOneof("size") == "machine_type":
        # The field names the key; the text starts at its value: `jobs[2].machine_type: n2-highmem-8: no pool ...`
        # (the CLI says `FILE:L:C: jobs[2] (name: big): machine_type: n2-highmem-8: ...`).
        return [FieldViolation(f"{at}.machine_type", why.removeprefix("machine_type "))]
    return [FieldViolation(f"{at}.resources", why)]


def _placement_violations(spec: spec_pb.JobSpec, block: UpdateBlock, at: str, known_regions: Collection[str] | None,
                          new_batch: bool) -> list[FieldViolation]:
    """Regions and groups that the database would refuse (insert_jobs), found before anything is written."""
    v = []
    if known_regions is not None:
        known = {r.rstrip(" ") for r in known_regions}  # the column's collation ignores trailing spaces
        for i, region in enumerate(spec.regions):
            if region.strip() and region.rstrip(" ") not in known:
                v.append(FieldViolation(f"{at}.regions[{i}]",
                                        f"unknown region {region!r}; one of {', '.join(sorted(known))}"))
    last_group = block.start_job_group_id + block.n_job_groups - 1
    if new_batch and spec.job_group.WhichOneof("ref") == "job_group_id" and spec.job_group.job_group_id > last_group:
        v.append(FieldViolation(f"{at}.job_group.job_group_id",
                                f"a new batch has job groups 0 to {last_group}, those of its request"))
    return v


def check_bunch(specs: list[spec_pb.JobSpec], first_job_id: int, block: UpdateBlock,
                field: str = "jobs", limits: Limits = Limits(), storage_roots: Sequence[str] = (),
                project: str = "", known_regions: Collection[str] | None = None,
                new_batch: bool = False, deployment: Deployment | None = None) -> list[FieldViolation]:
    """Every violation in a bunch whose first job gets id `first_job_id`; its files' URLs must lie
    under `storage_roots`, those of the batch's billing project `project`; its regions among
    `known_regions` (None: the database checks them); a collection of `deployment` able to run it ever
    (its pool enabled and its machine large enough, a machine type someone makes; None: not checked).
    With `new_batch` the update is the batch's
    first (SubmitBatch), so the groups that exist are known: the root and the update's."""
    if not specs:
        return [FieldViolation(field, "a bunch holds at least one job")]
    if len(specs) > limits.max_jobs_per_bunch:
        return [FieldViolation(field, f"at most {limits.max_jobs_per_bunch} jobs per bunch (max_jobs_per_bunch); "
                                      "send several bunches")]
    last = first_job_id + len(specs) - 1
    if first_job_id < block.start_job_id or last >= block.start_job_id + block.n_jobs:
        return [FieldViolation("first_index", f"the update reserved {block.n_jobs} jobs")]
    violations: list[FieldViolation] = []
    pools = pool_machines(deployment) if deployment is not None else None
    for i, spec in enumerate(specs):
        at = f"{field}[{i}]"
        present = {descriptor.name for descriptor, _ in spec.ListFields()}
        found = _check_spec(spec, present, first_job_id + i, block, at, limits)
        if "input_files" in present or "output_files" in present:
            found += file_url_violations(spec, storage_roots, project, at)
        if "regions" in present or "job_group" in present:
            found += _placement_violations(spec, block, at, known_regions, new_batch)
        if deployment is not None and pools is not None and not any(
                v.field.startswith((f"{at}.resources", f"{at}.machine_type")) for v in found):
            found += _size_violations(spec, at, pools) or _never_runs_violations(spec, at, deployment, pools)
        violations += found
    return violations


MAX_JOB_GROUP_DEPTH = 7
"""Job groups nest at most this deep below the root (insert_job_groups refuses deeper)."""


def job_group_rows(specs: Sequence[Any], block: UpdateBlock, first_index: int, field: str = "job_groups",
                   new_batch: bool = False) -> tuple[list[dict[str, Any]], list[FieldViolation]]:
    """The insert_job_groups rows of groups `first_index`, ... of the update `block`, and every
    violation: a parent must come before its child. With `new_batch` (SubmitBatch) every group
    that exists is the root or in `specs`, so the depth is checked here too."""
    if specs and not 0 <= first_index <= first_index + len(specs) <= block.n_job_groups:
        # As for jobs (check_bunch): ids outside the update's block, which could also
        # pass the INT column's range, are refused here.
        return [], [FieldViolation("first_index", f"the update reserved {block.n_job_groups} job groups")]
    start = block.start_job_group_id + first_index
    groups, violations = [], []
    depth = {0: 0}
    for i, spec in enumerate(specs):
        group_id = start + i
        ref = spec.parent.WhichOneof("ref")
        if ref == "in_update_index" and not 0 <= spec.parent.in_update_index < block.n_job_groups:
            violations.append(FieldViolation(f"{field}[{i}].parent.in_update_index",
                                             f"the update has {block.n_job_groups} job groups"))
            continue
        parent = (spec.parent.job_group_id if ref == "job_group_id"
                  else block.start_job_group_id + spec.parent.in_update_index if ref == "in_update_index" else 0)
        if not 0 <= parent < group_id:
            violations.append(FieldViolation(f"{field}[{i}].parent", "a parent group comes before its child"))
            continue
        if new_batch:
            depth[group_id] = depth.get(parent, 0) + 1
            if depth[group_id] > MAX_JOB_GROUP_DEPTH:
                violations.append(FieldViolation(f"{field}[{i}].parent",
                                                 f"job groups nest at most {MAX_JOB_GROUP_DEPTH} deep"))
        group: dict[str, Any] = {"job_group_id": group_id, "parent_id": parent,
                                 "attributes": [{"key": k, "value": v} for k, v in sorted(spec.attributes.items())]}
        if spec.HasField("cancel_after_n_failures"):
            group["cancel_after_n_failures"] = spec.cancel_after_n_failures
        if spec.HasField("retry_policy"):
            bad = retry_policy_violations(spec.retry_policy, f"{field}[{i}].retry_policy")
            violations += bad
            if not bad:
                group["retry_policy"] = retry_policy_json(spec.retry_policy)
        groups.append(group)
    return groups, violations


IMAGE_COLUMN_CHARS = 255
"""jobs.image is VARCHAR(255): the scheduler's hint of the job's image (migration 0026)."""


def job_row(spec: spec_pb.JobSpec, job_id: int, block: UpdateBlock, spec_ref: str,
            pools: Mapping[str, PoolMachine] | None = None) -> dict[str, Any]:
    """The insert_jobs JSON object of one valid job. A key whose value is insert_jobs' default is left out:
    the database reads every key of a thousand jobs per bunch, and most jobs set few fields."""
    cores, pool, memory, storage = choose_pool(spec, pools)
    row: dict[str, Any] = {"job_id": job_id, "cores_mcpu": cores, "inst_coll": pool, "spec_ref": spec_ref}
    if memory:
        row["memory_bytes"] = memory
    if storage:
        row["storage_bytes"] = storage
    ref = spec.job_group.WhichOneof("ref")
    if ref == "job_group_id" and spec.job_group.job_group_id:
        row["job_group_id"] = spec.job_group.job_group_id
    elif ref == "in_update_index":
        row["job_group_id"] = block.start_job_group_id + spec.job_group.in_update_index
    if spec.always_run:
        row["always_run"] = True
    if 0 < len(spec.image) <= IMAGE_COLUMN_CHARS:  # a longer one is only in the spec: the job goes first-fit
        row["image"] = spec.image
    if spec.regions:
        row["regions"] = list(spec.regions)
    if spec.priority:
        row["priority"] = spec.priority
    if spec.max_attempts:
        row["max_attempts"] = spec.max_attempts
    if spec.HasField("timeout") and spec.timeout.ToTimedelta().total_seconds() > 0:
        row["timeout_ms"] = max(1, round(spec.timeout.ToTimedelta().total_seconds() * 1000))
    if spec.parents:
        parents = []
        for parent in spec.parents:
            accepted = sum(_ACCEPTED_BITS[s] for s in set(parent.accepted_states)) or 1
            if parent.WhichOneof("ref") == "job_id":
                parents.append({"job_id": parent.job_id, "accepted_states": accepted})
            else:
                parents.append({"in_update_offset": parent.in_update_offset, "accepted_states": accepted})
        row["parents"] = parents
    if spec.attributes:
        row["attributes"] = [{"key": k, "value": v} for k, v in sorted(spec.attributes.items())]
    locks = []
    for lock in spec.locks:
        if lock.mode == spec_pb.LOCK_MODE_NONE:
            continue
        for name in sorted(set(lock.names)) or [""]:
            locks.append({"level": lock.level, "mode": _LOCK_MODES[lock.mode], "name": name})
    if locks:
        row["locks"] = locks
    if spec.HasField("retry_policy"):
        row["retry_policy"] = retry_policy_json(spec.retry_policy)
    if spec.provisioning_model == spec_pb.PROVISIONING_MODEL_ON_DEMAND:
        row["on_demand"] = True
    return row
