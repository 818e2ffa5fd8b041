"""Describing a batch in Python before submitting it.

    b = BatchBuilder("my-project", attributes={"name": "align"})
    first = b.job("busybox", ["sh", "-c", "echo hi"])
    b.job("busybox", ["true"], parents=[first], accept=("succeeded", "failed"))

Parents added in the same builder become negative in-update offsets, so a
submission never needs to know job ids in advance; an `int` parent names a
job of the batch that already exists. `add_job` takes a whole JobSpec (every
field of the proto) and `job_group` adds a job group, which is how batch
files (corral.batch_file) are built. A handle is good only in the builder
that returned it: one from another builder (another batch) is refused with a
`UsageError` at once, never turned into a reference to some job or group of
this one.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from corral import quantities
from corral.batch.v1 import job_group_pb2, job_spec_pb2, job_state_pb2
from corral.errors import UsageError

_STATES = {
    "succeeded": job_state_pb2.JOB_STATE_SUCCEEDED,
    "success": job_state_pb2.JOB_STATE_SUCCEEDED,
    "failed": job_state_pb2.JOB_STATE_FAILED,
    "error": job_state_pb2.JOB_STATE_ERROR,
    "cancelled": job_state_pb2.JOB_STATE_CANCELLED,
}


@dataclasses.dataclass(frozen=True)
class JobHandle:
    """A job added to a builder; pass it as a parent of later jobs of the same builder."""

    index: int
    """Position in the builder (0-based)."""
    builder: BatchBuilder | None = dataclasses.field(default=None, repr=False)
    """The builder that returned it: its index means nothing to any other."""


@dataclasses.dataclass(frozen=True)
class Parent:
    """A parent with its own accepted states, where a job's other parents take the call's `accept`."""

    job: JobHandle | int
    """The parent: a job of this builder, or the id of a job of the batch that already exists."""
    accept: Iterable[str] = ("succeeded",)
    """Its final states that let the child run: "succeeded", "failed", "error", "cancelled"."""


@dataclasses.dataclass(frozen=True)
class JobGroupHandle:
    """A job group added to a builder; pass it as a job's `job_group` or a later group's `parent`, in the same
    builder."""

    index: int
    """Position among the builder's groups (0-based)."""
    builder: BatchBuilder | None = dataclasses.field(default=None, repr=False)
    """The builder that returned it: its index means nothing to any other."""


class BatchBuilder:
    """Jobs and batch settings, turned into protos by `specs()`."""

    def __init__(self, billing_project: str, attributes: Mapping[str, str] | None = None,
                 callback_url: str | None = None, cancel_after_n_failures: int | None = None,
                 idempotency_token: str | None = None):
        self.billing_project = billing_project
        self.attributes = dict(attributes or {})
        self.callback_url = callback_url
        self.cancel_after_n_failures = cancel_after_n_failures
        self.idempotency_token = idempotency_token or uuid.uuid4().hex
        """Retrying a submission with the same builder never makes a second batch."""
        self._specs: list[bytes] = []
        """Each job's spec, serialized: a million no-op jobs hold some 100 MB here, where the messages
        themselves took 1.6 GB."""
        self._groups: list[job_group_pb2.JobGroupSpec] = []
        self.source: object | None = None
        """Where a batch file wrote these jobs (a `corral.batch_file_words.FileSource`; None: built in code), so
        that `corral submit` can say a refusal in the file's words."""

    def __len__(self) -> int:
        return len(self._specs)

    def job(
        self,
        image: str,
        command: Sequence[str] | str,
        *,
        parents: Iterable[JobHandle | int] = (),
        accept: Iterable[str] = ("succeeded",),
        always_run: bool = False,
        cores: float | str = 1.0,
        memory_bytes: int | str = 0,
        storage_bytes: int | str = 0,
        env: Mapping[str, str] | None = None,
        attributes: Mapping[str, str] | None = None,
        regions: Sequence[str] = (),
        timeout_s: float | str | None = None,
        max_attempts: int = 0,
        priority: int = 0,
        locks: Iterable[job_spec_pb2.JobLock] = (),
        retry_policy: job_spec_pb2.RetryPolicy | None = None,
        on_demand: bool = False,
        job_group: JobGroupHandle | None = None,
        secrets: Mapping[str, str] | None = None,
        image_pull_secret: str = "",
    ) -> JobHandle:
        """Add a job (to `job_group`, a handle from `job_group()`, else to the batch's root group); `command`
        is an argv list or a shell script string. `cores` is a number of cores (0.5) or text in cores or
        milli-cores ("0.5", "250m"); `memory_bytes` and `storage_bytes` are bytes (an int) or a size with its unit
        ("4Gi", "512Mi", "10G": Ki, Mi, Gi, Ti are powers of 1024, k, M, G, T powers of 1000); `timeout_s` is
        seconds or a duration with its unit ("90s", "30m", "2h", "1h30m"). Others are refused with a UsageError
        naming the accepted units (corral.quantities). `locks` are the resource locks it
        holds while it runs (`job_spec_pb2.JobLock(level=..., mode=..., names=[...])`): the scheduler never
        starts it while a running job of the billing project holds a clashing one. `retry_policy` says which
        failed attempts are tried again (out of memory with more memory, listed exit codes after a back-off,
        on-demand after preemptions); `on_demand` keeps it off spot machines. `memory_bytes` and
        `storage_bytes` (scratch storage) are reserved on its machine (0: its pool's share per core); one its
        pool's machine could never hold is refused at submission; a job whose writes reach its storage is killed
        and ends Failed saying so. `secrets`
        maps the name of a secret of the batch's billing project to the directory where the job reads its files
        (`{"db": "/secrets/db"}`, read-only). `image_pull_secret` names the secret of the batch's billing
        project holding the login to a private image's registry (files `username` and `password`, or Docker's
        config.json as `.dockerconfigjson`); the job never sees it."""
        cores_mcpu = _quantity("cores", quantities.parse_mcpu, cores)
        memory = _quantity("memory_bytes", quantities.parse_bytes, memory_bytes)
        storage = _quantity("storage_bytes", quantities.parse_bytes, storage_bytes)
        spec = job_spec_pb2.JobSpec(
            image=image, image_pull_secret=image_pull_secret, env=dict(env or {}), regions=list(regions),
            always_run=always_run, max_attempts=max_attempts, attributes=dict(attributes or {}), priority=priority,
            locks=list(locks),
            resources=job_spec_pb2.ResourceRequest(cores_mcpu=cores_mcpu, memory_bytes=memory,
                                                   storage_bytes=storage),
        )
        if isinstance(command, str):
            spec.script = command
        else:
            spec.argv.args.extend(command)
        if retry_policy is not None:
            spec.retry_policy.CopyFrom(retry_policy)
        if on_demand:
            spec.provisioning_model = job_spec_pb2.PROVISIONING_MODEL_ON_DEMAND
        if timeout_s is not None:
            spec.timeout.FromNanoseconds(_quantity("timeout_s", quantities.parse_duration_ns, timeout_s))
        for name, mount_path in (secrets or {}).items():
            spec.secrets.add(name=name, mount_path=mount_path)
        return self._add(spec, parents, accept, job_group)

    def add_job(self, spec: job_spec_pb2.JobSpec, *, parents: Iterable[JobHandle | int | Parent] = (),
                accept: Iterable[str] = ("succeeded",), job_group: JobGroupHandle | None = None) -> JobHandle:
        """Add a job given as a whole spec (a copy is kept). Its parents and group are given here, as handles,
        and replace any the spec names; a `Parent` carries its own accepted states, the others take `accept`."""
        copied = job_spec_pb2.JobSpec()
        copied.CopyFrom(spec)
        return self._add(copied, parents, accept, job_group)

    def _add(self, spec: job_spec_pb2.JobSpec, parents: Iterable[JobHandle | int | Parent], accept: Iterable[str],
             job_group: JobGroupHandle | None) -> JobHandle:
        """Keep `spec` (this builder's own), its parents and group set from handles."""
        index = len(self._specs)
        spec.ClearField("parents")
        spec.ClearField("job_group")
        accepted = _accepted(accept)
        for parent in parents:
            states = accepted
            if isinstance(parent, Parent):
                parent, states = parent.job, _accepted(parent.accept)
            if isinstance(parent, JobHandle):
                if parent.builder is not self:
                    # Its index is a position in another builder: as an offset here it would
                    # silently point at a job of this batch.
                    raise UsageError(f"parent {parent} was returned by another BatchBuilder; a parent is a "
                                     "handle from this builder or the int id of a job of the batch")
                spec.parents.append(job_spec_pb2.ParentRef(in_update_offset=parent.index - index,
                                                           accepted_states=states))
            elif isinstance(parent, int) and not isinstance(parent, bool):
                spec.parents.append(job_spec_pb2.ParentRef(job_id=parent, accepted_states=states))
            else:
                raise UsageError(f"parent {parent!r} is neither a JobHandle from this builder nor an int job id")
        if job_group is not None:
            if job_group.builder is not self:
                raise UsageError(f"job_group {job_group} was returned by another BatchBuilder: a job's group "
                                 "must be added to the same builder first")
            spec.job_group.in_update_index = job_group.index
        self._specs.append(spec.SerializeToString())
        return JobHandle(index, self)

    def job_group(self, *, parent: JobGroupHandle | None = None, attributes: Mapping[str, str] | None = None,
                  cancel_after_n_failures: int | None = None,
                  retry_policy: job_spec_pb2.RetryPolicy | None = None) -> JobGroupHandle:
        """Add a job group (under `parent`, else under the batch's root group): cancelling it cancels its
        jobs and subgroups; `cancel_after_n_failures` cancels it by itself; `retry_policy` applies to its
        jobs whose spec sets none."""
        index = len(self._groups)
        group = job_group_pb2.JobGroupSpec(attributes=dict(attributes or {}),
                                           cancel_after_n_failures=cancel_after_n_failures)
        if parent is not None:
            if parent.builder is not self:
                raise UsageError(f"parent {parent} was returned by another BatchBuilder: a parent group must be "
                                 "added before its child, to the same builder")
            group.parent.in_update_index = parent.index
        if retry_policy is not None:
            group.retry_policy.CopyFrom(retry_policy)
        self._groups.append(group)
        return JobGroupHandle(index, self)

    def batch_fields(self) -> dict[str, object]:
        """The batch settings as fields of SubmitBatch/CreateBatch requests."""
        return dict(billing_project=self.billing_project, attributes=self.attributes,
                    callback_url=self.callback_url or "", idempotency_token=self.idempotency_token,
                    cancel_after_n_failures=self.cancel_after_n_failures)

    def specs(self) -> list[job_spec_pb2.JobSpec]:
        """The job specs in order (relative parents already resolved to offsets)."""
        return [job_spec_pb2.JobSpec.FromString(spec) for spec in self._specs]

    def serialized_specs(self, first: int, end: int) -> list[bytes]:
        """The specs of jobs `first` to `end` (excluded), serialized: what a bunch of AddJobs sends."""
        return self._specs[first:end]

    def job_group_specs(self) -> list[job_group_pb2.JobGroupSpec]:
        """The job groups in order (parents already resolved to in-update indexes)."""
        return list(self._groups)

    def spec_bytes(self) -> int:
        """The size of every spec, serialized: what one request carrying them all would hold."""
        return sum(map(len, self._specs))

    def bunches(self, size: int, max_bytes: int | None = None) -> list[tuple[int, int]]:
        """(first_index, end_index) of each bunch of at most `size` jobs, for parallel AddJobs calls; with
        `max_bytes`, each also of at most that many bytes of specs (but never empty: a spec larger than it goes
        alone, for the server to judge)."""
        if max_bytes is None:
            return [(i, min(i + size, len(self._specs))) for i in range(0, len(self._specs), size)]
        found, first, held = [], 0, 0
        for index, spec in enumerate(self._specs):
            if index > first and (index - first >= size or held + len(spec) > max_bytes):
                found.append((first, index))
                first, held = index, 0
            held += len(spec)
        if first < len(self._specs):
            found.append((first, len(self._specs)))
        return found


def _quantity(name: str, parse: Callable[[Any], int], value: Any) -> int:
    """`parse(value)`, its refusal a UsageError naming the argument."""
    try:
        return parse(value)
    except quantities.QuantityError as e:
        raise UsageError(f"{name}: {e}") from None


def _accepted(accept: Iterable[str]) -> list[int]:
    return [_STATES[s.lower()] for s in accept]
