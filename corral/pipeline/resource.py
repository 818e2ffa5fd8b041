"""Files that jobs read and write: inputs, job outputs, groups of files with one root, Python results.

A resource file is a `str` whose text is a unique token (`__RESOURCE_FILE__7`), so that it can be put in a
command's f-string, joined with others (`' '.join(files)`) or formatted like any text. When a job's
command is added, the job finds the tokens in it, records what it reads and writes (and so which jobs it
depends on) and puts each file's path in the token's place. A path is relative to `$BATCH_TMPDIR`, the
directory each backend sets for the job: the local backend's scratch directory, or `/io` in a container.
"""

from __future__ import annotations

import itertools
import os
from typing import TYPE_CHECKING, Any, cast

from corral.pipeline.exceptions import BatchException

if TYPE_CHECKING:
    from corral.pipeline.job import Job, PythonJob

_uids = itertools.count()


class Resource:
    """Something a job's command can name: a file, a group of files or a Python result."""

    _uid: str

    def source(self) -> Job | None:
        """The job that writes it (None: an input file, there before the batch runs)."""
        raise NotImplementedError

    def _relative_path(self) -> str:
        """Where it is, relative to $BATCH_TMPDIR."""
        raise NotImplementedError

    def _add_output_path(self, path: str) -> None:
        raise NotImplementedError


class ResourceFile(Resource, str):
    """One file; a `str` (its token) wherever text is expected."""

    _prefix = "__RESOURCE_FILE__"

    def __new__(cls, *args: Any, **kwargs: Any) -> ResourceFile:
        uid = f"{cls._prefix}{next(_uids)}"
        made = str.__new__(cls, uid)
        made._uid = uid
        return made

    def __init__(self, value: str):
        super().__init__()
        self._value = value
        self._output_paths: list[str] = []
        self._resource_group: ResourceGroup | None = None

    def _add_output_path(self, path: str) -> None:
        if path not in self._output_paths:
            self._output_paths.append(path)
        source = self.source()
        if source is not None:
            source._external_outputs.add(self)

    def __str__(self) -> str:
        return self._uid

    def __repr__(self) -> str:
        return self._uid

    __hash__ = str.__hash__
    __eq__ = str.__eq__


class InputResourceFile(ResourceFile):
    """A file that exists before the batch runs (`Batch.read_input`), copied in for each job that reads it."""

    def __init__(self, value: str, input_path: str):
        super().__init__(value)
        self._input_path = input_path
        """Where it is: a local path or a URL (file://, gs://, az://)."""

    def source(self) -> None:
        return None

    def _relative_path(self) -> str:
        return f"inputs/{self._value}"


class JobResourceFile(ResourceFile):
    """A file a job writes: any attribute of a bash job (`j.ofile`), or a Python result as text."""

    def __init__(self, value: str, source: Job):
        super().__init__(value)
        self._source = source
        self._has_extension = False

    def source(self) -> Job:
        return self._source

    def _relative_path(self) -> str:
        return f"{self._source._dirname}/{self._value}"

    def add_extension(self, extension: str) -> JobResourceFile:
        """Give the file an extension (".vcf.bgz"), which tools that go by the name need; once only."""
        if self._has_extension:
            raise BatchException("Resource already has a file extension added.")
        self._value += extension
        self._has_extension = True
        return self


class ResourceGroup(Resource):
    """Files sharing a root (`{root}.bed`, `{root}.bim`, `{root}.fam`), named by identifier: `rg.bed` or
    `rg['bed']`; the group itself in a command is the root."""

    _prefix = "__RESOURCE_GROUP__"

    def __init__(self, source: Job | None, root: str, **files: ResourceFile):
        self._source = source
        self._root = root
        self._uid = f"{self._prefix}{next(_uids)}"
        self._resources: dict[str, ResourceFile] = {}
        for name, file in files.items():
            self._resources[name] = file
            file._resource_group = self

    def source(self) -> Job | None:
        return self._source

    def _relative_path(self) -> str:
        return f"{self._source._dirname if self._source else 'inputs'}/{self._root}"

    def _add_output_path(self, path: str) -> None:
        for name, file in self._resources.items():
            file._add_output_path(f"{path}.{name}")

    def _get_resource(self, item: str) -> ResourceFile:
        if item not in self._resources:
            raise BatchException(f"'{item}' not found in the resource group.\n"
                                 "Hint: you must declare each attribute when constructing the resource group.")
        return self._resources[item]

    def __getitem__(self, item: str) -> ResourceFile:
        return self._get_resource(item)

    def __getattr__(self, item: str) -> ResourceFile:
        if item.startswith("__") or item in ("_resources", "_source", "_root", "_uid"):
            raise AttributeError(item)  # copy and pickle ask for these before __init__ ran
        return self._get_resource(item)

    def __iter__(self):  # type: ignore[no-untyped-def]
        raise TypeError(f"{type(self).__name__!r} object is not iterable")

    def __add__(self, other: str) -> str:
        return self._uid + other

    def __radd__(self, other: str) -> str:
        return other + self._uid

    def __str__(self) -> str:
        return self._uid

    def __format__(self, spec: str) -> str:
        return format(self._uid, spec)


class PythonResult(Resource, str):
    """What a Python job's function returned (pickled). Another Python job may take it as an argument (its
    value arrives); a bash job reads it through `as_str()`, `as_repr()` or `as_json()`, files of text."""

    _prefix = "__PYTHON_RESULT__"

    def __new__(cls, *args: Any, **kwargs: Any) -> PythonResult:
        uid = f"{cls._prefix}{next(_uids)}"
        made = str.__new__(cls, uid)
        made._uid = uid
        return made

    def __init__(self, value: str, source: PythonJob):
        super().__init__()
        self._value = value
        self._source = source
        self._output_paths: list[str] = []
        self._json: JobResourceFile | None = None
        self._str: JobResourceFile | None = None
        self._repr: JobResourceFile | None = None

    def source(self) -> PythonJob:
        return self._source

    def _relative_path(self) -> str:
        return f"{self._source._dirname}/{self._value}"

    def _add_output_path(self, path: str) -> None:
        if path not in self._output_paths:
            self._output_paths.append(path)
        self._source._external_outputs.add(self)

    def _converted(self, suffix: str, extension: str) -> JobResourceFile:
        file = self._source._batch._new_job_resource_file(self._source, f"{self._value}-{suffix}")
        file.add_extension(extension)
        self._source._valid.add(file)
        self._source._mentioned.add(file)
        return file

    def as_json(self) -> JobResourceFile:
        """The result as JSON (`json.dumps`), a file."""
        if self._json is None:
            self._json = self._converted("json", ".json")
        return self._json

    def as_str(self) -> JobResourceFile:
        """The result as `str()` gives it, a file."""
        if self._str is None:
            self._str = self._converted("str", ".txt")
        return self._str

    def as_repr(self) -> JobResourceFile:
        """The result as `repr()` gives it, a file."""
        if self._repr is None:
            self._repr = self._converted("repr", ".txt")
        return self._repr

    def __str__(self) -> str:
        return self._uid

    def __repr__(self) -> str:
        return self._uid

    __hash__ = str.__hash__
    __eq__ = str.__eq__


def input_name(path: str) -> str:
    """The file name an input keeps in its job (its extension matters to tools): the last part of the path."""
    return os.path.basename(path.rstrip("/")) or "input"


def members(resource: Resource) -> list[Resource]:
    """`resource` and, when it is or belongs to a group, every file of the group: reading one file of a group
    brings the whole group (an index beside its data)."""
    group = resource if isinstance(resource, ResourceGroup) else cast(Any, resource)._resource_group \
        if isinstance(resource, ResourceFile) else None
    if group is None:
        return [resource]
    files: list[Resource] = list(group._resources.values())
    return files if isinstance(resource, ResourceGroup) else [resource, *[f for f in files if f is not resource]]
