"""`LocalBackend`: runs a batch on this machine, with no server: in containers where it can, else as processes.

Jobs run in dependency order, as many at once as the machine has cores. Where the worker's OCI runtime can run
here (root, runc, umoci, cgroups; services/worker/pipeline_containers.py, which corral's worker provides as
the entry point `corral.pipeline:containers`), each job runs in a container of its image as a corral worker
would run it (its spec compiled as the ServiceBackend compiles it, its files copied in and out of /io, its cpu
and memory limits, loopback only, a uid of its own); otherwise, or with `containers=False`, each runs as a
process of this machine (bash jobs with their shell, Python jobs with this interpreter), where its image is
not used and its cpu and memory are not enforced. The first line of output says which, and why not containers.
Files pass between jobs through one scratch directory: a process's $BATCH_TMPDIR, where a file lies for the
next job; a container's files are copied from it and back (only a job that succeeded copies back, or one that
is always_copy_output). Inputs are linked (local paths) or copied (URLs) in before the first job, and
`write_output` copies once its job has succeeded (or, for an `always_copy_output` job, once it ended, what it
wrote). A failed job's dependents are not run (except `always_run` ones); the others go on, and `run()` then
raises the first failure: the command's `subprocess.CalledProcessError`, or, in a container, a
`BatchException` for a job that ended in error (its image could not be had, an output was not written).
"""

from __future__ import annotations

import concurrent.futures
import os
import shlex
import shutil
import subprocess
import sys
import threading
import uuid
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from corral.batch.v1 import job_spec_pb2
from corral.pipeline import files, pickling
from corral.pipeline.backend.base import Backend
from corral.pipeline.exceptions import BatchException
from corral.pipeline.job import DEFAULT_SHELL, BashJob, Job, PythonJob
from corral.pipeline.resource import Resource

if TYPE_CHECKING:
    from corral.pipeline.batch import Batch

RUNNER = Path(__file__).resolve().parent.parent / "runner.py"
CONTAINERS_ENTRY_POINT = ("corral.pipeline", "containers")
"""Where the module that runs jobs in containers is found: the worker's OCI runtime is the server's, which the
client imports nothing of, so the server names it as an entry point (as it names `corral up` to the CLI)."""
CONTAINERS_VARIABLE = "CORRAL_PIPELINE_CONTAINERS"
"""'0' runs LocalBackend's jobs as processes, '1' in containers (or fails saying why not), unset: where the
machine can; the `containers` argument wins over it."""
SAYS_CONTAINERS = ("LocalBackend: jobs run in OCI containers of their images under crun or runc, as a corral worker "
                   "runs them (files copied in and out of /io, cpu and memory limited, no network, a uid of their own)")
SAYS_PROCESSES = ("LocalBackend: jobs run as processes of this machine, not in containers (their images are not "
                  "used, cpu and memory are not enforced): {why}")


class LocalBackend(Backend):
    """Runs batches on this machine; `tmp_dir` holds each run's scratch directory (`TMP_DIR/batch/XXXXXX`).
    `containers` (not in hailtop.batch): True runs jobs in containers (a run fails saying why where the
    machine cannot), False as processes, None (default) as $CORRAL_PIPELINE_CONTAINERS says ('1' or '0'), else
    in containers where the machine can. `gsa_key_file` and `extra_docker_run_flags` are accepted for
    hailtop.batch's scripts and not used: containers are run with runc, not Docker."""

    def __init__(self, tmp_dir: str = "/tmp/", gsa_key_file: str | None = None,
                 extra_docker_run_flags: str | None = None, parallelism: int | None = None,
                 containers: bool | None = None):
        self._tmp_dir = os.path.abspath(os.path.expanduser(tmp_dir)).rstrip("/") or "/"
        self._parallelism = parallelism or os.cpu_count() or 1
        """How many jobs run at once (default: the machine's cores)."""
        self._containers = containers

    def _output_path(self, path: str) -> str:
        return path if files.is_url(path) else os.path.abspath(os.path.expanduser(path))

    def _run(self, batch: Batch, dry_run: bool, verbose: bool, delete_scratch_on_exit: bool,
             **backend_kwargs: Any) -> None:
        if backend_kwargs:
            raise ValueError(f"LocalBackend does not support any of these keywords: {backend_kwargs}")
        why_not = self._why_not_containers()
        print(SAYS_PROCESSES.format(why=why_not) if why_not else SAYS_CONTAINERS, flush=True)
        scratch = self._scratch_dir()
        run = _Run(batch, scratch, self._parallelism, dry_run, verbose)
        try:
            if not why_not and not dry_run:
                containers = _container_runtime()
                assert containers is not None  # or why_not would say it is missing
                run.containers = containers.Containers(self._tmp_dir)
            return run.run()
        finally:
            if run.containers is not None:
                run.containers.close()
            if delete_scratch_on_exit:
                shutil.rmtree(scratch, ignore_errors=True)

    def _why_not_containers(self) -> str:
        """Why this run's jobs run as processes; '' when they run in containers."""
        wanted = self._containers
        if wanted is None and os.environ.get(CONTAINERS_VARIABLE, "") in ("0", "1"):
            wanted = os.environ[CONTAINERS_VARIABLE] == "1"
        if wanted is False:
            return ("asked for (containers=False)" if self._containers is False
                    else f"asked for (${CONTAINERS_VARIABLE}=0)")
        containers = _container_runtime()
        reasons = containers.why_not_containers() if containers is not None else [
            "corral's worker is not installed here (only its client), and it runs the containers"]
        if reasons and wanted:
            raise BatchException("LocalBackend cannot run jobs in containers on this machine: " + "; ".join(reasons))
        return "; ".join(reasons)

    def _scratch_dir(self) -> str:
        while True:
            path = f"{self._tmp_dir}/batch/{uuid.uuid4().hex[:6]}"
            try:
                os.makedirs(path)
                return path
            except FileExistsError:
                continue


class _Run:
    """One run of a batch: its jobs' states and the threads that run them."""

    def __init__(self, batch: Batch, scratch: str, parallelism: int, dry_run: bool, verbose: bool):
        self.batch = batch
        self.scratch = scratch
        self.parallelism = parallelism
        self.dry_run = dry_run
        self.verbose = verbose
        self.print_lock = threading.Lock()
        self.first_error: BaseException | None = None
        self.containers: Any = None
        """The worker's OCI runtime, when jobs run in containers."""
        self.specs: dict[Job, job_spec_pb2.JobSpec] = {}

    def run(self) -> None:
        self._stage_inputs()
        jobs = self.batch._unsubmitted_jobs()
        if self.containers is not None:
            self._compile(jobs)
        children: dict[Job, list[Job]] = {job: [] for job in jobs}
        for job in jobs:
            for parent in job._dependencies:
                if not parent._submitted:  # one an earlier run() ran is over
                    children[parent].append(job)
        waiting = {job: sum(not parent._submitted for parent in job._dependencies) for job in jobs}
        failed_parents: dict[Job, bool] = {job: False for job in jobs}
        ready = [job for job in jobs if waiting[job] == 0]
        running: dict[concurrent.futures.Future[bool], Job] = {}
        with concurrent.futures.ThreadPoolExecutor(self.parallelism, thread_name_prefix="pipeline-job") as pool:
            while ready or running:
                while ready and len(running) < self.parallelism:
                    job = ready.pop(0)
                    if failed_parents[job] and not job._always_run:
                        self._say(f"Job {job._job_id} ({job.name or job._uid}) was cancelled: a job it depends on "
                                  "failed or was cancelled. Not running")
                        job._submitted = True
                        self._finished(job, False, children, waiting, failed_parents, ready)
                        continue
                    running[pool.submit(self._run_job, job)] = job
                if not running:
                    continue
                done, _ = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
                for future in done:
                    job = running.pop(future)
                    job._submitted = True
                    self._finished(job, future.result(), children, waiting, failed_parents, ready)
        if self.first_error is not None:
            raise self.first_error
        print("Batch completed successfully!", flush=True)

    @staticmethod
    def _finished(job: Job, succeeded: bool, children: dict[Job, list[Job]], waiting: dict[Job, int],
                  failed_parents: dict[Job, bool], ready: list[Job]) -> None:
        for child in children[job]:
            failed_parents[child] = failed_parents[child] or not succeeded
            waiting[child] -= 1
            if waiting[child] == 0:
                ready.append(child)

    def _stage_inputs(self) -> None:
        """Every input in the scratch directory: linked when local, copied when a URL; inputs written straight
        to an output are copied there."""
        for file in self.batch._input_resources:
            path = os.path.join(self.scratch, file._relative_path())
            os.makedirs(os.path.dirname(path), exist_ok=True)
            local = files.local_path(file._input_path)
            if self.dry_run:
                continue
            if local is not None:
                os.symlink(local, path)
            else:
                files.copy(file._input_path, path)
            for dest in file._output_paths:
                files.copy(local or path, dest)

    def _compile(self, jobs: list[Job]) -> None:
        """Each job's spec, as the ServiceBackend submits it with the scratch directory as its scratch URL, and
        the files the specs read; every image checked that can be without a registry, before any job runs."""
        from corral.pipeline.backend.service import job_spec
        assert self.containers is not None
        uploads: dict[str, bytes] = {}
        missing = []
        for job in jobs:
            self.specs[job] = spec = job_spec(job, files.url_of(self.scratch), uploads)
            if (why := self.containers.missing(spec.image)) is not None:
                missing.append(f"job {job._job_id} ({job.name or job._uid}): image {spec.image!r}: {why}")
        if missing:
            raise BatchException("LocalBackend: no job was run, for these images cannot be had: " + "; ".join(missing))
        for url, data in uploads.items():
            files.write_bytes(url, data)

    def _run_job(self, job: Job) -> bool:
        """Run `job` and copy its outputs; whether it succeeded (a failure is kept as `first_error`)."""
        if self.containers is not None:
            return self._run_container(job)
        os.makedirs(os.path.join(self.scratch, job._dirname), exist_ok=True)
        if isinstance(job, PythonJob):
            lines = []
            for index, (result, function, args, kwargs) in enumerate(job._calls):
                call = pickling.call_path(job, index)
                Path(self.scratch, call).write_bytes(pickling.call_bytes(result, function, args, kwargs))
                lines.append(f"{shlex.quote(sys.executable)} {shlex.quote(str(RUNNER))} {shlex.quote(call)}")
            script, shell = " && ".join(lines), DEFAULT_SHELL
        else:
            assert isinstance(job, BashJob)
            script, shell = job._script(), job._shell or DEFAULT_SHELL
        name = f"job {job._job_id}" + (f" ({job.name})" if job.name else "")
        if self.dry_run or self.verbose:
            self._say(f"# {name}\n{script}")
        if self.dry_run or not script:
            return True
        env = {**os.environ, **job._env, "BATCH_TMPDIR": self.scratch}
        argv = [shell, "-c", script]
        try:
            done = subprocess.run(argv, env=env, cwd=self.scratch, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=job._timeout_s())
            output, code = done.stdout, done.returncode
        except subprocess.TimeoutExpired as e:
            output, code = (e.output or b"") + f"\n{name} timed out after {e.timeout:g} s\n".encode(), -9
        except OSError as e:  # the shell cannot be run
            output, code = f"{name}: cannot run {shell!r}: {e}\n".encode(), 127
        if output:
            self._say(f"--- {name} ---\n{output.decode(errors='replace').rstrip()}")
        if code == 0:
            try:
                self._copy_outputs(job)
            except (OSError, NotImplementedError) as e:
                output, code = output + f"\n{name}: {e}\n".encode(), 1
                self._say(f"{name}: {e}")
        elif job._always_copy_output:
            try:
                self._copy_outputs(job, missing_ok=True)
            except (OSError, NotImplementedError) as e:
                output += f"\n{name}: output files not copied: {e}\n".encode()
                self._say(f"{name}: output files not copied: {e}")
        if code != 0:
            self._say(f"{name} failed (exit code {code})")
            error = subprocess.CalledProcessError(code, argv, output=output)
            with self.print_lock:
                self.first_error = self.first_error or error
            return False
        return True

    def _run_container(self, job: Job) -> bool:
        """Run `job`'s spec in a container (the runtime copies its files in and out); whether it succeeded."""
        assert self.containers is not None
        spec = self.specs[job]
        name = f"job {job._job_id}" + (f" ({job.name})" if job.name else "")
        if self.verbose:
            self._say(f"# {name} in {spec.image}\n{spec.argv.args[-1]}")
        outcome, output = self.containers.run(spec, job._job_id)
        if output:
            self._say(f"--- {name} ---\n{output.decode(errors='replace').rstrip()}")
        if outcome.state == "Success":
            return True
        error: BaseException
        if outcome.state == "Failed":
            code = outcome.exit_code if outcome.exit_code is not None else -9  # timed out: killed
            error = subprocess.CalledProcessError(code, list(spec.argv.args), output=output)
        else:
            error = BatchException(f"{name} ended in error: {outcome.error_message}")
        self._say(f"{name} failed: {outcome.error_message}")
        with self.print_lock:
            self.first_error = self.first_error or error
        return False

    def _copy_outputs(self, job: Job, missing_ok: bool = False) -> None:
        """Copy the job's outputs to where `write_output` said; one it did not write is an error unless
        `missing_ok` (after it failed, with always_copy_output)."""
        for resource in sorted(job._external_outputs, key=str):
            source = os.path.join(self.scratch, resource._relative_path())
            if not os.path.lexists(source):
                if missing_ok:
                    continue
                raise FileNotFoundError(f"its output {_name(job, resource)} was not written (no file {source})")
            for dest in getattr(resource, "_output_paths", []):
                files.copy(source, dest)

    def _say(self, text: str) -> None:
        with self.print_lock:
            print(text, flush=True)


def _name(job: Job, resource: Resource) -> str:
    return repr(job._resources_inverse.get(resource, resource._relative_path()))


def _container_runtime() -> ModuleType | None:
    """The module that runs a job in a container (services/worker/pipeline_containers.py), or None where
    corral's worker is not installed."""
    group, name = CONTAINERS_ENTRY_POINT
    found = entry_points(group=group, name=name)
    return next(iter(found)).load() if found else None
