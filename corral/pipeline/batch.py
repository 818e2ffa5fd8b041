"""`Batch`: the graph of jobs and files a pipeline script describes, run by a backend."""

from __future__ import annotations

import itertools
import os
import re
import secrets
import string
import warnings
from typing import TYPE_CHECKING, Any

from corral.pipeline import values
from corral.pipeline.exceptions import BatchException
from corral.pipeline.job import BashJob, Job, PythonJob
from corral.pipeline.resource import (
    InputResourceFile,
    JobResourceFile,
    PythonResult,
    Resource,
    ResourceGroup,
    input_name,
)

if TYPE_CHECKING:
    from corral.pipeline.backend.base import Backend

BACKEND_VARIABLE = "CORRAL_BATCH_BACKEND"
"""'local' or 'service': the backend of a Batch given none (default: local)."""

_batch_uids = itertools.count()
_ALPHABET = string.ascii_lowercase + string.digits


def _random(n: int = 5) -> str:
    return "".join(secrets.choice(_ALPHABET) for _ in range(n))


class Batch:
    """The jobs of one pipeline and the files between them; `run()` hands them to the backend."""

    def __init__(self, name: str | None = None, backend: Backend | None = None,
                 attributes: dict[str, str] | None = None, requester_pays_project: str | None = None,
                 default_image: str | None = None, default_memory: str | int | None = None,
                 default_cpu: str | int | float | None = None, default_storage: str | int | None = None,
                 default_regions: list[str] | None = None, default_timeout: str | int | float | None = None,
                 default_shell: str | None = None, default_python_image: str | None = None,
                 default_spot: bool | None = None, project: str | None = None,
                 cancel_after_n_failures: int | None = None):
        from corral.pipeline.backend.local import LocalBackend
        from corral.pipeline.backend.service import ServiceBackend
        if backend is None:
            chosen = os.environ.get(BACKEND_VARIABLE, "local")
            if chosen not in ("local", "service"):
                raise ValueError(f"${BACKEND_VARIABLE}: {chosen!r} is neither 'local' nor 'service'")
            backend = ServiceBackend() if chosen == "service" else LocalBackend()
        self._backend = backend
        self.name = name
        self.attributes = dict(attributes or {})
        if "name" in self.attributes:
            raise BatchException("'name' is not a valid attribute. Use the name argument instead.")
        if requester_pays_project is not None:
            raise NotImplementedError("corral has no requester-pays buckets: requester_pays_project must be None")
        if project is not None:
            warnings.warn("The project argument to Batch is deprecated and ignored by corral.", stacklevel=2)
        # Checked here, not when the first job takes them: a wrong default is refused where it is written.
        if default_cpu is not None:
            values.cpu_mcpu(default_cpu)
        if default_memory is not None:
            values.check_memory(default_memory)
        if default_storage is not None:
            values.storage_bytes(default_storage)
        if default_timeout is not None:
            values.timeout_s(default_timeout)
        if cancel_after_n_failures is not None and cancel_after_n_failures <= 0:
            raise ValueError(f"cancel_after_n_failures: {cancel_after_n_failures} must be greater than 0")
        self._default_image = default_image
        self._default_memory = default_memory
        self._default_cpu = default_cpu
        self._default_storage = default_storage
        if default_regions is None and isinstance(backend, ServiceBackend):  # as hailtop.batch's Batch does
            default_regions = backend.regions or [backend.default_region()]
        self._default_regions = default_regions
        self._default_timeout = default_timeout
        self._default_shell = default_shell
        self._default_python_image = default_python_image
        self._default_spot = default_spot
        self._cancel_after_n_failures = cancel_after_n_failures
        self._uid = f"__BATCH__{next(_batch_uids)}"
        self._jobs: list[Job] = []
        self._resource_map: dict[str, Resource] = {}
        self._input_resources: list[InputResourceFile] = []
        self._job_tokens: set[str] = set()
        self._service_batch: Any = None
        """The ServiceBackend's batch once submitted (or named by from_batch_id): a later run() updates it."""
        self._scratch_token: str | None = None
        """The ServiceBackend's scratch directory of this batch, the same for each run()."""

    @staticmethod
    def from_batch_id(batch_id: int, *args: Any, **kwargs: Any) -> Batch:
        """A Batch whose `run()` adds its jobs to the existing batch `batch_id` (an update), with the
        ServiceBackend given in `kwargs` (or the default one); the other arguments are Batch's."""
        from corral.pipeline.backend.service import ServiceBackend
        batch = Batch(*args, **kwargs)
        if not isinstance(batch._backend, ServiceBackend):
            raise BatchException("Batch.from_batch_id needs a ServiceBackend: a LocalBackend's batches are not kept")
        batch._service_batch = batch._backend._existing(batch_id)
        return batch

    def __str__(self) -> str:
        return self._uid

    def _unique_job_token(self) -> str:
        token = _random()
        while token in self._job_tokens:
            token = _random()
        self._job_tokens.add(token)
        return token

    def _apply_defaults(self, job: Job) -> None:
        if self._default_memory is not None:
            job.memory(self._default_memory)
        if self._default_cpu is not None:
            job.cpu(self._default_cpu)
        if self._default_storage is not None:
            job.storage(self._default_storage)
        if self._default_regions is not None:
            job.regions(self._default_regions)
        if self._default_timeout is not None:
            job.timeout(self._default_timeout)
        if self._default_spot is not None:
            job.spot(self._default_spot)

    def new_job(self, name: str | None = None, attributes: dict[str, str] | None = None,
                shell: str | None = None) -> BashJob:
        """Same as `new_bash_job`."""
        return self.new_bash_job(name, attributes, shell)

    def new_bash_job(self, name: str | None = None, attributes: dict[str, str] | None = None,
                     shell: str | None = None) -> BashJob:
        """A new bash job with the batch's defaults; `shell` runs its commands (default /bin/bash)."""
        job = BashJob(self, self._unique_job_token(), name=name, attributes=attributes,
                      shell=shell if shell is not None else self._default_shell)
        if self._default_image is not None:
            job.image(self._default_image)
        self._apply_defaults(job)
        self._jobs.append(job)
        return job

    def new_python_job(self, name: str | None = None, attributes: dict[str, str] | None = None) -> PythonJob:
        """A new Python job with the batch's defaults (its image: `default_python_image`)."""
        job = PythonJob(self, self._unique_job_token(), name=name, attributes=attributes)
        if self._default_python_image is not None:
            job.image(self._default_python_image)
        self._apply_defaults(job)
        self._jobs.append(job)
        return job

    def _new_job_resource_file(self, source: Job, value: str | None = None) -> JobResourceFile:
        file = JobResourceFile(value if value is not None else _random(), source)
        self._resource_map[file._uid] = file
        return file

    def _new_python_result(self, source: PythonJob, value: str) -> PythonResult:
        result = PythonResult(value, source)
        self._resource_map[result._uid] = result
        return result

    def _new_input_resource_file(self, input_path: str, value: str) -> InputResourceFile:
        self._backend._check_path(input_path)
        file = InputResourceFile(value, input_path)
        self._resource_map[file._uid] = file
        self._input_resources.append(file)
        return file

    def _new_resource_group(self, source: Job, mappings: dict[str, str], root: str) -> ResourceGroup:
        files = {}
        for name, template in mappings.items():
            if not isinstance(template, str):
                raise BatchException(f"value for name '{name}' is not a string. Found '{type(template)}' instead.")
            files[name] = self._new_job_resource_file(source, template.format(root=root))
        group = ResourceGroup(source, root, **files)
        self._resource_map[group._uid] = group
        return group

    def read_input(self, path: str | os.PathLike[str]) -> InputResourceFile:
        """An input file: a local path or a URL (file://, gs://, az://); copied in for each job that reads it."""
        path = os.fspath(path)
        return self._new_input_resource_file(path, f"{_random()}/{input_name(path)}")

    def read_input_group(self, **paths: str | os.PathLike[str]) -> ResourceGroup:
        """Input files sharing a root, by identifier: `read_input_group(bed='x.bed', bim='x.bim')` gives
        `{root}.bed` and `{root}.bim` in the job."""
        root = _random()
        files = {name: self._new_input_resource_file(os.fspath(path), f"{root}.{name}") for name, path in paths.items()}
        group = ResourceGroup(None, root, **files)
        self._resource_map[group._uid] = group
        return group

    def write_output(self, resource: Resource, dest: str | os.PathLike[str]) -> None:
        """Copy `resource` to `dest` once its job succeeded (a group: each file to `dest.IDENTIFIER`)."""
        if not isinstance(resource, Resource):
            raise BatchException(f"'write_output' only accepts Resource inputs. Found '{type(resource)}'.")
        source = resource.source()
        if isinstance(resource, (JobResourceFile, PythonResult)) and source is not None \
                and resource not in source._mentioned:
            name = source._resources_inverse.get(resource, str(resource))
            how = ("the PythonJob 'call' method" if isinstance(resource, PythonResult)
                   else "the job methods 'command' or 'declare_resource_group'")
            raise BatchException(f"undefined resource '{name}'\nHint: resources must be defined within {how}")
        dest = self._backend._output_path(os.fspath(dest))
        resource._add_output_path(dest)

    def select_jobs(self, pattern: str) -> list[Job]:
        """The jobs whose name matches the regular expression `pattern` (from its start)."""
        return [j for j in self._jobs if j.name is not None and re.match(pattern, j.name) is not None]

    def run(self, dry_run: bool = False, verbose: bool = False, delete_scratch_on_exit: bool = True,
            **backend_kwargs: Any) -> Any:
        """Run the jobs not run yet with the batch's backend (see each backend's `_run` for its keyword
        arguments): run again after adding jobs, and only the new ones run (on the service, as an update of the
        same batch). A new job may depend on one that ran before, not read its files: they are not kept."""
        self._jobs = self._ordered()
        for job in self._jobs:
            if job._submitted:
                continue
            for resource in job._inputs:
                source = resource.source()
                if source is not None and source._submitted:
                    raise BatchException(
                        f"job {job.name or job._uid} reads a file of job {source.name or source._job_id}, which an "
                        "earlier run() ran: files are not kept between runs; add both jobs before running")
        return self._backend._run(self, dry_run, verbose, delete_scratch_on_exit, **backend_kwargs)

    def _unsubmitted_jobs(self) -> list[Job]:
        """The jobs a run() has still to run, in order."""
        return [job for job in self._jobs if not job._submitted]

    def _ordered(self) -> list[Job]:
        """The jobs, each after the jobs it depends on, otherwise in the order they were made; numbered from 1."""
        seen: set[Job] = set()
        order: list[Job] = []

        def visit(job: Job) -> None:
            if job in seen:
                return
            seen.add(job)
            for parent in job._dependencies:
                visit(parent)
            order.append(job)
        for job in self._jobs:
            visit(job)
        index = {job: i for i, job in enumerate(order, start=1)}
        for job in order:
            if job._batch is not self:
                raise BatchException(f"job {job.name or job._uid} depends on a job of another batch")
            if any(index[parent] >= index[job] for parent in job._dependencies):
                raise BatchException("cycle detected in dependency graph")
            if not job._submitted:  # a submitted job keeps the id the service gave it
                job._job_id = index[job]
        return order
