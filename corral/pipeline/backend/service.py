"""`ServiceBackend`: a pipeline batch compiled to corral job specs and submitted through `corral.Client`.

Each bash job becomes a job running its commands with its shell in its image (default `debian`); each Python
job runs corral/pipeline/runner.py in its image (default `python`) on its calls, pickled by this client into
files under `remote_tmpdir`. Files move with the worker's staging: a job's inputs (`input_files`) are copied in
before its command and its outputs (`output_files`) out after it succeeds (or fails too, for a job with
`always_copy_output`: `always_copy_outputs`), other jobs' files through a
scratch directory `REMOTE_TMPDIR/BATCH_TOKEN/`, which is removed when a run that waited ends.

Paths in commands are under $BATCH_TMPDIR, which the script sets to `/io` in a container (the OCI runtime's
job directory, where the worker stages files) and to `io` under the working directory in the process runtime
(which puts a file's container path below the job's directory), so the same specs run in both.
"""

from __future__ import annotations

import os
import shlex
import sys
import uuid
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import corral
from corral import aio
from corral.batch.v1 import batch_pb2, job_spec_pb2, job_state_pb2
from corral.builder import BatchBuilder, JobHandle
from corral.cli_config import Config
from corral.costs import estimate_lines
from corral.pipeline import files, pickling
from corral.pipeline.backend.base import Backend
from corral.pipeline.exceptions import BatchException
from corral.pipeline.job import DEFAULT_SHELL, BashJob, Job, PythonJob
from corral.pipeline.resource import InputResourceFile, Resource

if TYPE_CHECKING:
    from corral.pipeline.batch import Batch

BILLING_PROJECT_VARIABLE = "CORRAL_BILLING_PROJECT"
REMOTE_TMPDIR_VARIABLE = "CORRAL_REMOTE_TMPDIR"
REGIONS_VARIABLE = "CORRAL_REGIONS"
"""Regions (comma-separated) a ServiceBackend's jobs may run in when it is given none (hailtop.batch's
HAIL_BATCH_REGIONS)."""
DEFAULT_IMAGE = "debian"
"""Bash jobs' image when neither the job nor the batch names one: corral up seeds it (docs/images.md)."""
DEFAULT_PYTHON_IMAGE = "python"
"""Python jobs' image likewise: Debian's python3 with cloudpickle."""
DEFAULT_PYTHON_IMAGE_VERSION = (3, 11)
"""The Python minor version of DEFAULT_PYTHON_IMAGE: a client of another cannot use it (pickles differ)."""
CONTAINER_ROOT = "/io"
"""Where a job's files are in its container (the OCI runtime's job directory, the job's own)."""
RUNNER = Path(__file__).resolve().parent.parent / "runner.py"
INLINE_SCRIPT_BYTES = 10 * 1024
"""A bash job's commands up to this size go in its spec; larger ones (a spec may hold 256 KiB, and a request
4 MiB) go to a file under the scratch directory that the job reads (hailtop.batch's threshold)."""
ALL_STATES = ("succeeded", "failed", "error", "cancelled")
_SET_TMPDIR = ('if [ -d /io ] && [ -w /io ]; then BATCH_TMPDIR=/io; else BATCH_TMPDIR="$PWD/io"; fi; '
               "export BATCH_TMPDIR")
_JOB_STATES = {job_state_pb2.JOB_STATE_PENDING: "Pending", job_state_pb2.JOB_STATE_READY: "Ready",
               job_state_pb2.JOB_STATE_CREATING: "Creating", job_state_pb2.JOB_STATE_RUNNING: "Running",
               job_state_pb2.JOB_STATE_SUCCEEDED: "Success", job_state_pb2.JOB_STATE_FAILED: "Failed",
               job_state_pb2.JOB_STATE_ERROR: "Error", job_state_pb2.JOB_STATE_CANCELLED: "Cancelled"}
"""corral's job states in hailtop.batch's words."""


class ServiceBackend(Backend):
    """Submits batches to corral as `billing_project` (default $CORRAL_BILLING_PROJECT, else the profile's
    `billing_project`), with intermediate files under `remote_tmpdir` (default $CORRAL_REMOTE_TMPDIR, else the
    profile's `remote_tmpdir`; a URL under one of the project's storage roots, e.g.
    `file://DATA_DIR/storage/default/tmp` on corral up). It connects as the CLI does: the profile `profile`
    (default the current one of $CORRAL_CONFIG), with `token` in place of its token when given. `bucket`,
    `google_project`, `gcs_requester_pays_configuration` and `gcs_bucket_allow_list` are Google-only and
    refused when set. `regions` are where its batches' jobs may run by default (`Batch(default_regions=...)`
    and a job's `regions()` choose otherwise): as given, else $CORRAL_REGIONS (comma-separated), else the
    service's `default_region()`, asked when first needed. `ANY_REGION` leaves it none, and a Batch then takes
    the default region, as hailtop.batch's does."""

    ANY_REGION: ClassVar[list[str]] = ["any_region"]
    """Given as `regions`: the backend names no region (hailtop.batch's value)."""

    def __init__(self, *args: Any, billing_project: str | None = None, bucket: str | None = None,
                 remote_tmpdir: str | None = None, google_project: str | None = None, token: str | None = None,
                 regions: list[str] | None = None, gcs_requester_pays_configuration: Any = None,
                 gcs_bucket_allow_list: list[str] | None = None, profile: str | None = None):
        if len(args) > 2:
            raise TypeError(f"ServiceBackend() takes 2 positional arguments but {len(args)} were given")
        if args:
            warnings.warn("Use of deprecated positional argument 'billing_project' in ServiceBackend(). Specify "
                          "'billing_project' as a keyword argument instead.", stacklevel=2)
            billing_project = args[0]
            bucket = args[1] if len(args) > 1 else bucket
        google_only = {"bucket": bucket, "google_project": google_project,
                       "gcs_requester_pays_configuration": gcs_requester_pays_configuration,
                       "gcs_bucket_allow_list": gcs_bucket_allow_list}
        if given := [name for name, value in google_only.items() if value is not None]:
            raise NotImplementedError(f"corral's ServiceBackend has no {', '.join(given)}: name the storage with "
                                      "remote_tmpdir (a URL under the billing project's storage roots)")
        saved = Config.load().profile(profile)  # its settings: `corral profile set` (corral up's admin has them)
        billing_project = billing_project or os.environ.get(BILLING_PROJECT_VARIABLE) or saved.billing_project
        if not billing_project:
            raise ValueError("the billing_project parameter of ServiceBackend must be set, or "
                             f"${BILLING_PROJECT_VARIABLE}, or the profile's (`corral profile set billing_project "
                             "NAME`)")
        remote_tmpdir = remote_tmpdir or os.environ.get(REMOTE_TMPDIR_VARIABLE) or saved.remote_tmpdir
        if not remote_tmpdir:
            raise ValueError("the remote_tmpdir parameter of ServiceBackend must be set, or "
                             f"${REMOTE_TMPDIR_VARIABLE}, or the profile's (`corral profile set remote_tmpdir URL`): "
                             "a URL under the billing project's storage roots")
        self._billing_project = billing_project
        self.remote_tmpdir = files.url_of(remote_tmpdir).rstrip("/")
        self._profile = profile
        self._token = token
        self._client: corral.Client | None = None
        if regions is None and (listed := os.environ.get(REGIONS_VARIABLE)):
            regions = [region.strip() for region in listed.split(",") if region.strip()]
        self._regions: list[str] | None = None if regions == ServiceBackend.ANY_REGION else regions
        self._regions_known = regions is not None
        """False until `regions` is first read, when neither the caller nor $CORRAL_REGIONS named any: it is then
        the service's default region."""

    @property
    def regions(self) -> list[str] | None:
        """The regions its batches' jobs may run in by default (None: none named)."""
        if not self._regions_known:
            self._regions, self._regions_known = [self.default_region()], True
        return self._regions

    @regions.setter
    def regions(self, regions: list[str] | None) -> None:
        self._regions, self._regions_known = regions, True

    def supported_regions(self) -> list[str]:
        """The regions the service runs jobs in, the preferred first (corral's ListRegions)."""
        return list(self._connected().regions().regions)

    def default_region(self) -> str:
        """The service's default region: where it places a job that names none first (the first of
        `supported_regions()`: a cloud deployment's first configured region, `local` on corral up)."""
        return self._connected().regions().default_region

    def _connected(self) -> corral.Client:
        if self._client is None:
            address, token, ca_cert, auth = aio.profile_connection(self._profile) if self._token is None \
                else _profile_with(self._profile, self._token)
            self._client = corral.Client(address, token, ca_cert=ca_cert, auth_address=auth)
        return self._client

    def _close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _output_path(self, path: str) -> str:
        return files.url_of(path)

    def _existing(self, batch_id: int) -> ServiceBatch:
        """A handle of the batch `batch_id`, which must exist (Batch.from_batch_id)."""
        client = self._connected()
        client.get_batch(batch_id)
        return ServiceBatch(client, batch_id)

    def _run(self, batch: Batch, dry_run: bool, verbose: bool, delete_scratch_on_exit: bool, *,
             wait: bool = True, open: bool = False, disable_progress_bar: bool = False,
             callback: str | None = None, token: str | None = None, **unknown: Any) -> ServiceBatch | None:
        """Submit the batch; with `wait`, wait for it (a progress line unless `disable_progress_bar`), then remove
        its scratch files (unless `delete_scratch_on_exit=False`). `callback` is a URL the service POSTs to when the
        batch completes; `token` names the scratch directory (default: random). `open` opens no browser: corral
        has no web page for a batch. Returns the batch's handle (None for a dry run, which prints the specs and the
        batch's estimate: its worst case and expected cost, from the service, which writes nothing)."""
        if unknown:
            raise ValueError(f"ServiceBackend.run does not support any of these keywords: {unknown}")
        batch._scratch_token = batch._scratch_token or token or uuid.uuid4().hex[:12]
        scratch = f"{self.remote_tmpdir}/{batch._scratch_token}"
        builder, uploads = compile_batch(batch, self._billing_project, scratch, callback)
        if dry_run:  # the specs, then what they would cost: EstimateBatch writes nothing
            for spec in builder.specs():
                print(spec)
            print("\n".join(estimate_lines(self._connected().estimate(builder), self._billing_project)), flush=True)
            return None
        for url, data in uploads.items():
            files.write_bytes(url, data)
        for file in batch._input_resources:  # inputs written straight to an output: no job to do it
            for dest in file._output_paths:
                files.copy(files.url_of(file._input_path), dest)
        jobs = batch._unsubmitted_jobs()
        if not jobs:
            print("nothing to submit: the batch has no job that has not run", flush=True)
            if wait and batch._service_batch is not None:
                batch._service_batch.wait(disable_progress_bar=disable_progress_bar)
            return batch._service_batch
        client = self._connected()
        if batch._service_batch is None:
            batch_id, first_job_id = client.submit(builder).batch_id, 1
            batch._service_batch = ServiceBatch(client, batch_id)
            print(f"Submitted batch {batch_id} ({len(builder)} jobs) to billing project {self._billing_project}",
                  flush=True)
        else:
            batch_id = batch._service_batch.id
            first_job_id = client.update(batch_id, builder).update.start_job_id
            print(f"Added {len(builder)} jobs to batch {batch_id}", flush=True)
        for offset, job in enumerate(jobs):  # the service numbers a submission's jobs in order
            job._job_id, job._submitted = first_job_id + offset, True
        handle = batch._service_batch
        if open:
            print(f"open=True: corral has no web page for a batch; `corral batch {batch_id}` shows it", flush=True)
        if wait:
            status = handle.wait(disable_progress_bar=disable_progress_bar)
            print(f"batch {handle.id} complete: {status['state']}", flush=True)
            if delete_scratch_on_exit:
                try:
                    files.remove_tree(scratch)
                except OSError as e:
                    print(f"could not remove the scratch files {scratch}: {e}", file=sys.stderr)
        return handle


def compile_batch(batch: Batch, billing_project: str, scratch: str,
                  callback: str | None = None) -> tuple[BatchBuilder, dict[str, bytes]]:
    """The batch as a corral builder, and the files to write before submitting it (URL to bytes): Python jobs' calls,
    long scripts. Pure but
    for pickling: no I/O, so the specs can be checked without a server."""
    attributes = dict(batch.attributes)
    if batch.name is not None:
        attributes["name"] = batch.name
    builder = BatchBuilder(billing_project, attributes=attributes, callback_url=callback,
                           cancel_after_n_failures=batch._cancel_after_n_failures)
    uploads: dict[str, bytes] = {}
    handles: dict[Job, JobHandle | int] = {job: job._job_id for job in batch._jobs if job._submitted}
    for job in batch._unsubmitted_jobs():
        spec = job_spec(job, scratch, uploads)
        handles[job] = builder.add_job(spec, parents=[handles[p] for p in job._dependencies],
                                       accept=ALL_STATES if job._always_run else ("succeeded",))
    return builder, uploads


def job_spec(job: Job, scratch: str, uploads: dict[str, bytes]) -> job_spec_pb2.JobSpec:
    """`job` as a corral job spec whose files pass through `scratch` (a URL); the files it reads that the client
    writes (Python calls, long scripts) are added to `uploads` (URL to bytes). LocalBackend runs the same specs
    in containers."""
    inputs: dict[str, str] = {}  # container path to URL
    if isinstance(job, PythonJob):
        image = job._image or DEFAULT_PYTHON_IMAGE
        if job._image is None and sys.version_info[:2] != DEFAULT_PYTHON_IMAGE_VERSION:
            raise BatchException(
                f"Python job {job.name or job._job_id}: this client runs Python {sys.version_info[0]}."
                f"{sys.version_info[1]} and the image {DEFAULT_PYTHON_IMAGE!r} Python "
                f"{'.'.join(map(str, DEFAULT_PYTHON_IMAGE_VERSION))}; a function pickled by one cannot be loaded by "
                "the other: run the client with that version, or name an image with yours (default_python_image)")
        runner = f"{job._dirname}/runner.py"
        lines = [f"cat > \"$BATCH_TMPDIR\"/{shlex.quote(runner)} <<'__CORRAL_PIPELINE_RUNNER__'\n"
                 f"{RUNNER.read_text()}__CORRAL_PIPELINE_RUNNER__"]
        calls = []
        for index, (result, function, args, kwargs) in enumerate(job._calls):
            call = pickling.call_path(job, index)
            uploads[f"{scratch}/{call}"] = pickling.call_bytes(result, function, args, kwargs)
            inputs[f"{CONTAINER_ROOT}/{call}"] = f"{scratch}/{call}"
            calls.append(f"python3 \"$BATCH_TMPDIR\"/{shlex.quote(runner)} {shlex.quote(call)}")
        script, shell = "\n".join([*lines, " && ".join(calls)]), "/bin/sh"
    else:
        assert isinstance(job, BashJob)
        image = job._image or DEFAULT_IMAGE
        script, shell = job._script(), job._shell or DEFAULT_SHELL
        if len(script.encode()) > INLINE_SCRIPT_BYTES:
            code = f"{job._dirname}/code.sh"
            uploads[f"{scratch}/{code}"] = script.encode()
            inputs[f"{CONTAINER_ROOT}/{code}"] = f"{scratch}/{code}"
            script = f". \"$BATCH_TMPDIR\"/{shlex.quote(code)}"
    for resource in job._inputs:
        if isinstance(resource, InputResourceFile):
            inputs[f"{CONTAINER_ROOT}/{resource._relative_path()}"] = files.url_of(resource._input_path)
        else:
            inputs[f"{CONTAINER_ROOT}/{resource._relative_path()}"] = f"{scratch}/{resource._relative_path()}"
    outputs: list[tuple[str, str]] = []
    for resource in sorted(job._internal_outputs, key=str):
        outputs.append((f"{CONTAINER_ROOT}/{resource._relative_path()}", f"{scratch}/{resource._relative_path()}"))
    for resource in sorted(job._external_outputs, key=str):
        for dest in _output_paths(resource):
            outputs.append((f"{CONTAINER_ROOT}/{resource._relative_path()}", files.url_of(dest)))
    body = f"{_SET_TMPDIR}\nmkdir -p \"$BATCH_TMPDIR\"/{shlex.quote(job._dirname)}\n{script}"
    attributes = dict(job.attributes)
    if job.name is not None:
        attributes["name"] = job.name
    spec = job_spec_pb2.JobSpec(
        image=image, argv=job_spec_pb2.Argv(args=[shell, "-c", body]), env=job._env, attributes=attributes,
        always_run=job._always_run, always_copy_outputs=job._always_copy_output, regions=job._regions or [],
        resources=job_spec_pb2.ResourceRequest(cores_mcpu=job._mcpu(), memory_bytes=job._memory_bytes(),
                                               storage_bytes=job._storage_bytes()),
        input_files=[job_spec_pb2.InputFile(from_url=url, to_path=path) for path, url in sorted(inputs.items())],
        output_files=[job_spec_pb2.OutputFile(from_path=path, to_url=url) for path, url in outputs],
    )
    if (timeout := job._timeout_s()) is not None:
        spec.timeout.FromNanoseconds(int(timeout * 1e9))
    if job._spot is False:
        spec.provisioning_model = job_spec_pb2.PROVISIONING_MODEL_ON_DEMAND
    return spec


def _output_paths(resource: Resource) -> list[str]:
    return list(getattr(resource, "_output_paths", []))


def _profile_with(profile: str | None, token: str) -> tuple[str, str, str | None, str]:
    found = Config.load().profile(profile)
    return found.frontend, token, found.ca_cert, found.auth


class ServiceBatch:
    """A submitted batch, as hailtop.batch's client returns it: `id`, `status()`, `get_job(n)`,
    `get_job_log(n)`, `wait()`, `cancel()`, `debug_info()`. Jobs are numbered from 1, in the order the
    batch ran them (each after the jobs it depends on, otherwise as they were made)."""

    def __init__(self, client: corral.Client, batch_id: int):
        self._client = client
        self.id = batch_id

    def status(self) -> dict[str, Any]:
        """The batch: 'state' is 'running', then 'success' or 'failure', or 'cancelled' from when it was cancelled
        ('complete' says whether its jobs have all ended); and its job counts."""
        return _batch_status(self._client.get_batch(self.id))

    def wait(self, disable_progress_bar: bool = False) -> dict[str, Any]:
        """Wait until the batch is complete (a progress line on stderr unless disabled); its status."""
        return _batch_status(self._client.wait(self.id, progress=not disable_progress_bar))

    def cancel(self) -> None:
        """Cancel the batch: its jobs that are not always_run stop."""
        self._client.cancel_batch(self.id)

    def get_job(self, job_id: int) -> ServiceJob:
        """Job `job_id` (from 1) of the batch."""
        return ServiceJob(self._client, self.id, job_id)

    def get_job_log(self, job_id: int) -> dict[str, str]:
        """Job `job_id`'s log (its latest attempt's), under 'main' (the one container a corral job has)."""
        return self.get_job(job_id).log()

    def jobs(self) -> list[dict[str, Any]]:
        """Every job's status."""
        return [_job_status(job) for job in self._client.jobs(self.id)]

    def debug_info(self) -> dict[str, Any]:
        """The batch's status and every job's."""
        return {"status": self.status(), "jobs": self.jobs()}


class ServiceJob:
    """One job of a submitted batch."""

    def __init__(self, client: corral.Client, batch_id: int, job_id: int):
        self._client = client
        self.batch_id = batch_id
        self.job_id = job_id

    def status(self) -> dict[str, Any]:
        """'state' in hailtop.batch's words (Pending, Ready, Running, Success, Failed, Error, Cancelled), the
        exit code and error of its latest attempt."""
        return _job_status(self._client.get_job(self.batch_id, self.job_id))

    def log(self) -> dict[str, str]:
        """Its latest attempt's log, under 'main'."""
        return {"main": self._client.job_log(self.batch_id, self.job_id).decode(errors="replace")}

    def wait(self) -> dict[str, Any]:
        """Wait for its batch to complete; its status then."""
        self._client.wait(self.batch_id)
        return self.status()


def _batch_status(batch: batch_pb2.Batch) -> dict[str, Any]:
    counts = batch.counts
    complete = batch.state == batch_pb2.BATCH_STATE_COMPLETE
    if batch.HasField("cancellation"):  # at once, as hailtop.batch says it, while its jobs still drain
        state = "cancelled"
    elif not complete:
        state = "running"
    elif counts.n_succeeded == counts.n_jobs:
        state = "success"
    else:
        state = "failure"
    return {"id": batch.batch_id, "billing_project": batch.billing_project, "state": state, "complete": complete,
            "n_jobs": counts.n_jobs, "n_completed": counts.n_succeeded + counts.n_failed + counts.n_errored
            + counts.n_cancelled, "n_succeeded": counts.n_succeeded, "n_failed": counts.n_failed + counts.n_errored,
            "n_cancelled": counts.n_cancelled, "attributes": dict(batch.attributes)}


def _job_status(job: Any) -> dict[str, Any]:
    """A job's status; `spec` only from GetJob (a listed job has none)."""
    attempt = job.attempts[-1] if job.attempts else None
    resources = job.spec.resources
    status = {"batch_id": job.batch_id, "job_id": job.job_id, "name": job.spec.attributes.get("name"),
            "state": _JOB_STATES.get(job.state, "Pending"),
            "exit_code": attempt.exit_code if attempt is not None and attempt.HasField("exit_code") else None,
            "error": attempt.error_message if attempt is not None else "",
            "attributes": dict(job.spec.attributes),
            "spec": {"image": job.spec.image, "resources": {
                "cores_mcpu": resources.cores_mcpu, "memory_bytes": resources.memory_bytes,
                "storage_bytes": resources.storage_bytes,
                "preemptible": job.spec.provisioning_model != job_spec_pb2.PROVISIONING_MODEL_ON_DEMAND}},
            "status": {"region": attempt.region if attempt is not None else None}}
    if not job.HasField("spec"):
        del status["spec"]
    return status
