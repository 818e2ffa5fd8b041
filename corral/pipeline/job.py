"""Jobs of a pipeline batch: bash jobs (commands in an image) and Python jobs (functions called in one).

Each setter returns the job, as hailtop.batch's do, and checks its value at once: a wrong cpu, memory,
storage or timeout is a ValueError naming it, raised where it was written.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import warnings
from collections.abc import Callable
from shlex import quote
from typing import TYPE_CHECKING, Any

from corral.pipeline import values
from corral.pipeline.exceptions import BatchException
from corral.pipeline.resource import (
    PythonResult,
    Resource,
    ResourceFile,
    ResourceGroup,
    members,
)

if TYPE_CHECKING:
    from corral.pipeline.batch import Batch

DEFAULT_SHELL = "/bin/bash"
"""The shell of a bash job that names none (hailtop.batch's default)."""

_TOKENS = re.compile(r"(__RESOURCE_FILE__\d+|__RESOURCE_GROUP__\d+|__PYTHON_RESULT__\d+|__JOB__\d+|__BATCH__\d+)")
_job_uids = iter(range(1, 2**63))


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c == "-" else "_" for c in name)


class Job:
    """What bash and Python jobs share: resources, dependencies and settings."""

    def __init__(self, batch: Batch, token: str, *, name: str | None = None,
                 attributes: dict[str, str] | None = None, shell: str | None = None):
        self._batch = batch
        self._token = token
        self._shell = shell
        self.name = name
        self.attributes = dict(attributes or {})
        if "name" in self.attributes:
            raise BatchException("'name' is not a valid attribute. Use the name argument instead.")
        self._uid = f"__JOB__{next(_job_uids)}"
        self._job_id: int | None = None
        """Its number in the batch once run (1-based, in the order the backend runs or submits them)."""
        self._submitted = False
        """Whether a run() of its batch ran or submitted it already (a later run() leaves it be)."""
        self._image: str | None = None
        self._cpu: str | int | float | None = None
        self._memory: str | int | None = None
        self._storage: str | int | None = None
        self._timeout: str | int | float | None = None
        self._always_run = False
        self._always_copy_output = False
        self._spot: bool | None = None
        self._regions: list[str] | None = None
        self._n_max_attempts = 20
        self._env: dict[str, str] = {}
        self._resources: dict[str, Resource] = {}
        self._resources_inverse: dict[Resource, str] = {}
        self._inputs: set[Resource] = set()
        """Files it reads that others wrote or that were there before (not its own)."""
        self._internal_outputs: set[Resource] = set()
        """Its files that later jobs read."""
        self._external_outputs: set[Resource] = set()
        """Its files written somewhere by `Batch.write_output`."""
        self._mentioned: set[Resource] = set()
        """Resources named in its commands or call arguments."""
        self._valid: set[Resource] = set()
        """Its own resources that it defines (named in a command, a group it declared, a result)."""
        self._dependencies: dict[Job, None] = {}
        """The jobs it waits for, in the order they were found (a dict keeps it)."""
        self._dirname = f"{_safe(name)[:250 - len(token)]}-{token}" if name else token

    def _get_resource(self, item: str) -> Resource:
        if item not in self._resources:
            file = self._batch._new_job_resource_file(self, item)
            self._resources[item] = file
            self._resources_inverse[file] = item
        return self._resources[item]

    def __getitem__(self, item: str) -> Resource:
        return self._get_resource(item)

    def __getattr__(self, item: str) -> Resource:
        if item.startswith("_"):  # its own fields, asked for before __init__ set them (copy, pickle)
            raise AttributeError(item)
        return self._get_resource(item)

    def __iter__(self):  # type: ignore[no-untyped-def]
        raise TypeError(f"{type(self).__name__!r} object is not iterable")

    def __str__(self) -> str:
        return self._uid

    __hash__ = object.__hash__

    def depends_on(self, *jobs: Job) -> Job:
        """Run only after `jobs` (as well as the jobs whose files it reads)."""
        for job in jobs:
            if not isinstance(job, Job):
                raise BatchException(f"depends_on takes jobs; found {type(job).__name__}")
            self._dependencies[job] = None
        return self

    def env(self, variable: str, value: str) -> Job:
        """Set an environment variable of its command."""
        self._env[variable] = value
        return self

    def image(self, image: str) -> Job:
        """The container image it runs in (the service backend; the local backend runs processes)."""
        self._image = image
        return self

    def cpu(self, cores: str | int | float | None) -> Job:
        """Cores: a number (1, 0.25) or milli-cores ('250m')."""
        if cores is not None:
            values.cpu_mcpu(cores)
        self._cpu = cores
        return self

    def memory(self, memory: str | int | None) -> Job:
        """Memory: 'lowmem', 'standard' or 'highmem' (1, 4 or 7 GiB per core) or a size ('1Gi', bytes)."""
        if memory is not None:
            values.check_memory(memory)
        self._memory = memory
        return self

    def storage(self, storage: str | int | None) -> Job:
        """Scratch storage: a size ('10Gi', bytes)."""
        if storage is not None:
            values.storage_bytes(storage)
        self._storage = storage
        return self

    def timeout(self, timeout: str | int | float | None) -> Job:
        """Longest the job may run, in seconds (or '30m', '2h'); None: no limit."""
        if timeout is not None:
            values.timeout_s(timeout)
        self._timeout = timeout
        return self

    def always_run(self, always_run: bool = True) -> Job:
        """Run even when a job it depends on failed or was cancelled."""
        self._always_run = always_run
        return self

    def always_copy_output(self, always_copy_output: bool = True) -> Job:
        """Copy its outputs even when it fails (those it wrote; one it did not is no further error)."""
        self._always_copy_output = always_copy_output
        return self

    def spot(self, is_spot: bool) -> Job:
        """False: run it on on-demand machines only."""
        self._spot = is_spot
        return self

    def regions(self, regions: list[str] | None) -> Job:
        """The regions it may run in (None: any)."""
        self._regions = list(regions) if regions is not None else None
        return self

    def n_max_attempts(self, n_max_attempts: int) -> Job:
        """Kept for hailtop.batch's scripts; corral's retry policy decides attempts (docs/pipeline.md)."""
        self._n_max_attempts = n_max_attempts
        return self

    def cloudfuse(self, bucket: str, mount_point: str, *, read_only: bool = True) -> Job:
        raise NotImplementedError("corral does not mount buckets (no cloudfuse): read them with read_input")

    gcsfuse = cloudfuse

    def _mcpu(self) -> int:
        return values.cpu_mcpu(self._cpu) if self._cpu is not None else 1000

    def _memory_bytes(self) -> int:
        return values.memory_bytes(self._memory, self._mcpu()) if self._memory is not None else 0

    def _storage_bytes(self) -> int:
        return values.storage_bytes(self._storage) if self._storage is not None else 0

    def _timeout_s(self) -> float | None:
        return values.timeout_s(self._timeout) if self._timeout is not None else None

    def _use(self, resource: Resource, where: str) -> None:
        """Record that this job names `resource` (in a command or as an argument)."""
        source = resource.source()
        if source is not self:
            for member in members(resource):
                if not isinstance(member, ResourceGroup):
                    self._inputs.add(member)
            if source is not None:
                if resource not in source._valid:
                    name = source._resources_inverse.get(resource, str(resource))
                    raise BatchException(f"undefined resource '{name}'\nHint: resources must be defined within the "
                                         "job methods 'command' or 'declare_resource_group'")
                if self._always_run:
                    warnings.warn("A job marked as always run has a resource file dependency on another job. If "
                                  f"the dependent job fails, the always run job may not succeed: {where}",
                                  stacklevel=4)
                self._dependencies[source] = None
                for member in members(resource):
                    if not isinstance(member, ResourceGroup):
                        source._internal_outputs.add(member)
        else:
            self._valid.update(members(resource))
            self._valid.add(resource)
        self._mentioned.add(resource)

    def _interpolate(self, command: str, allow_python_results: bool = False) -> str:
        """`command` with each resource's token replaced by its path under $BATCH_TMPDIR."""
        def path_of(match: re.Match[str]) -> str:
            token = match.group()
            if token.startswith("__JOB__"):
                raise BatchException(f"found a reference to a Job object in command '{command}'.")
            if token.startswith("__BATCH__"):
                raise BatchException(f"found a reference to a Batch object in command '{command}'.")
            if token.startswith("__PYTHON_RESULT__") and not allow_python_results:
                raise BatchException("found a reference to a PythonResult object. hint: Use one of the methods "
                                     f"`as_str`, `as_json` or `as_repr` on a PythonResult. command: '{command}'")
            resource = self._batch._resource_map.get(token)
            if resource is None:
                raise BatchException(f"undefined resource '{token}' in command '{command}'.\n"
                                     "Hint: resources must be from the same batch as the current job.")
            self._use(resource, command)
            return "${BATCH_TMPDIR}/" + quote(resource._relative_path())
        return _TOKENS.sub(path_of, command)


class BashJob(Job):
    """A job that runs shell commands (`command`) in its image."""

    def __init__(self, batch: Batch, token: str, *, name: str | None = None,
                 attributes: dict[str, str] | None = None, shell: str | None = None):
        super().__init__(batch, token, name=name, attributes=attributes, shell=shell)
        self._command: list[str] = []

    def command(self, command: str) -> BashJob:
        """Add a command; files named in it (`{j.ofile}`, `{other.ofile}`, `{b.read_input(...)}`) become paths,
        and another job's file makes this job depend on it. An empty command is ignored, with a warning."""
        if command.strip() == "":
            what = f"job {self.name!r}" if self.name else "unnamed job"
            warnings.warn(f"Ignoring empty command specified for {what}.", stacklevel=2)
            return self
        self._command.append(self._interpolate(command))
        return self

    def declare_resource_group(self, **mappings: dict[str, str]) -> BashJob:
        """Declare groups of output files sharing a root: `declare_resource_group(bfile={'bed': '{root}.bed',
        'bim': '{root}.bim'})` makes `j.bfile` (the root) with `j.bfile.bed` and `j.bfile.bim`."""
        for name, files in mappings.items():
            if name in self._resources:
                raise BatchException(f"resource '{name}' of the job is already defined")
            if not isinstance(files, dict):
                raise BatchException(f"value for name '{name}' is not a dict. Found '{type(files)}' instead.")
            group = self._batch._new_resource_group(self, files, root=name)
            self._resources[name] = group
            self._resources_inverse[group] = name
            self._valid.add(group)
            self._valid.update(group._resources.values())
        return self

    def _script(self) -> str:
        """Its commands as one script: each command in braces, the next only if it succeeded."""
        return " && ".join(f"{{\n{command.strip()}\n}}" for command in self._command)


class PythonJob(Job):
    """A job that calls Python functions (`call`) in its image, each result a `PythonResult`."""

    def __init__(self, batch: Batch, token: str, *, name: str | None = None,
                 attributes: dict[str, str] | None = None):
        super().__init__(batch, token, name=name, attributes=attributes)
        self._calls: list[tuple[PythonResult, Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = []
        self.n_results = 0

    def call(self, unapplied: Callable[..., Any], *args: Any, **kwargs: Any) -> PythonResult:
        """Call `unapplied(*args, **kwargs)` in the job. Arguments that are files arrive as paths, resource
        groups as dicts of paths, Python results as their values; the arguments must fit the function's
        signature (checked now: a BatchException)."""
        if not callable(unapplied):
            raise BatchException(f"unapplied must be a callable function. Found {type(unapplied)}.")
        if inspect.iscoroutinefunction(unapplied):
            coroutine_function = unapplied

            def unapplied(*args: Any, **kwargs: Any) -> Any:
                return asyncio.run(coroutine_function(*args, **kwargs))
        for value in (*args, *kwargs.values()):
            if isinstance(value, Job):
                raise BatchException("arguments to a PythonJob cannot be other job objects.")
        try:
            inspect.signature(unapplied).bind(*args, **kwargs)
        except ValueError as e:
            if "no signature found" not in str(e):  # builtins such as print have none to check
                raise
        except TypeError as e:
            raise BatchException(f"Cannot call {getattr(unapplied, '__name__', unapplied)} with the supplied "
                                 f"arguments: {e}") from e

        def walk(value: Any) -> None:
            if isinstance(value, Resource):
                self._use(value, f"an argument of {getattr(unapplied, '__name__', 'a function')}")
            elif isinstance(value, (list, tuple)):
                for item in value:
                    walk(item)
            elif isinstance(value, dict):
                for item in value.values():
                    walk(item)
        walk(args)
        walk(kwargs)
        self.n_results += 1
        result = self._batch._new_python_result(self, f"result{self.n_results}")
        self._resources[result._value] = result
        self._resources_inverse[result] = result._value
        self._use(result, "its result")
        self._calls.append((result, unapplied, args, kwargs))
        return result


def prepared(value: Any) -> Any:
    """A call's argument as the runner reads it (corral/pipeline/runner.py): files as paths relative to
    $BATCH_TMPDIR, results to unpickle, containers walked, anything else as it is."""
    if isinstance(value, PythonResult):
        return ("py_path", value._relative_path())
    if isinstance(value, ResourceFile):
        return ("path", value._relative_path())
    if isinstance(value, ResourceGroup):
        return ("dict_path", {name: f._relative_path() for name, f in value._resources.items()})
    if isinstance(value, list):
        return ("list", [prepared(v) for v in value])
    if isinstance(value, tuple):
        return ("tuple", tuple(prepared(v) for v in value))
    if isinstance(value, dict):
        return ("dict", {k: prepared(v) for k, v in value.items()})
    return ("value", value)

