"""Input and output files of an attempt, copied by the worker (as root when it
isolates jobs) in and out of the job's working directory.

Nothing the job made is ever followed. Paths below the working directory
are walked one component at a time with O_NOFOLLOW from a descriptor of the
directory, so a symbolic link, wherever it sits, stops the copy instead of
leading it elsewhere: a job that makes `out.txt` a link to a key cannot have
the worker read the key for it. Outputs are also only read when the job's
own user could read them (which a hard link to someone else's file fails)
and only regular files and directories are copied. Inputs are written the
same way, so a link inside one input cannot redirect a later one.

Every storage URL goes through one hook, `check_url`, before its copy, and
is opened through `ObjectStores` (object_stores.py): the local disk, GCS or
Azure Blob Storage with the deployment's credentials. An object is moved
whole by one fsspec call bounded by `ObjectStores.timeout_s`, between the
object store and a descriptor opened here as above (named to fsspec by its
/proc/self/fd path, which is that open file and nothing a job could swap in).
An input URL that is a prefix of objects (a "directory") brings each object
below it; an output directory sends each file in it.
"""

from __future__ import annotations

import asyncio
import errno
import os
import posixpath
import shutil
import stat
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

import fsspec
from fsspec.exceptions import FSTimeoutError
from fsspec.implementations.local import LocalFileSystem

from corral.batch.v1 import job_spec_pb2
from services.worker.object_stores import SCHEMES, Location, ObjectStores, describe_schemes

UrlCheck = Callable[[str], None]
"""Raises (any exception, its message saying why) if the deployment does not allow a storage URL."""

_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def allow_all_urls(url: str) -> None:
    """The default URL policy: every URL may be copied from and to."""


class CopyRefused(Exception):
    """A file cannot be copied safely; the message says which and why."""


def url_refusals(what: str, url: str) -> list[str]:
    """Why a worker cannot copy `url`: a scheme it has no file system for, or a file:// URL naming a host."""
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        return [f"{what} URL {url!r} is not one a worker copies ({describe_schemes()})"]
    if parts.scheme == "file" and parts.netloc:
        return [f"{what} URL {url!r} names a host; a file:// URL is a path on the worker: file:///path"]
    return []


def path_refusals(what: str, path: str) -> list[str]:
    """Why `path` cannot name a file inside the job's container view."""
    p = PurePosixPath(path)
    if not p.is_absolute() or ".." in p.parts or p == PurePosixPath("/"):
        return [f"{what} {path!r} must be an absolute path below / without '..'"]
    return []


def host_path(work: Path, container_path: str) -> Path:
    """Where a container path lives for the process runtime: below the working directory."""
    return work / posixpath.normpath(container_path).lstrip("/")


def make_directory_beneath(work: Path, container_path: str) -> Path:
    """Make the directory a container path names below the working directory, and its missing parents, each
    0700 and without following a link on the way (a link an input brought stops it); an existing directory
    is kept. Returns its host path (a mount point, e.g. a secret's)."""
    work_fd = os.open(work, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        parent_fd, name = _parent_beneath(work_fd, container_path, create=True)
        try:
            try:
                os.mkdir(name, 0o700, dir_fd=parent_fd)
            except FileExistsError:
                pass
            try:
                os.close(os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd))
            except OSError as e:
                raise CopyRefused(_describe(e, container_path)) from e
        finally:
            os.close(parent_fd)
    finally:
        os.close(work_fd)
    return host_path(work, container_path)


def copy_inputs(spec: job_spec_pb2.JobSpec, work: Path, check_url: UrlCheck, *, stores: ObjectStores) -> list[str]:
    """Copy every input into `work` (before the job runs). A local source that is a link is followed (the
    user named it), and where it leads is checked too; links inside a copied directory are copied as links.
    Returns the container paths it made: each directory made on the way to an input (root's, 0700), then
    the inputs themselves, so that a caller can give exactly those to the job's user."""
    made: list[str] = []
    work_fd = os.open(work, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for f in spec.input_files:
            try:
                check_url(f.from_url)
                source = stores.locate(f.from_url)
                real = _resolved(source, check_url) if source.local else ""
                parent_fd, name = _parent_beneath(work_fd, f.to_path, create=True, made=made)
                try:
                    if not source.local:
                        _fetch(source, parent_fd, name, stores.timeout_s)
                    elif os.path.isdir(real):
                        _copy_dir_in(real, parent_fd, name)
                    else:
                        _copy_file_in(real, parent_fd, name)
                finally:
                    os.close(parent_fd)
                made.append(posixpath.normpath(f.to_path))
            except Exception as e:
                missing = None if _local(f.from_url) else f"{f.from_url}, or its bucket or container, does not exist"
                raise CopyRefused(f"{f.from_url} -> {f.to_path}: {_reason(e, missing, stores.timeout_s)}") from e
    finally:
        os.close(work_fd)
    return made


def give_to(work: Path, uid: int, gid: int) -> None:
    """Make `work` and everything in it the job's (links themselves, never what they point to)."""
    for top, dirs, files in os.walk(work):
        for name in (*dirs, *files):
            os.chown(os.path.join(top, name), uid, gid, follow_symlinks=False)
    os.chown(work, uid, gid, follow_symlinks=False)


def copy_outputs(spec: job_spec_pb2.JobSpec, work: Path, uid: int, check_url: UrlCheck, *,
                 stores: ObjectStores) -> None:
    """Copy every output out of `work` (once the job's processes are gone), as described above."""
    work_fd = os.open(work, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for f in spec.output_files:
            _copy_output(f, work_fd, uid, check_url, stores)
    finally:
        os.close(work_fd)


async def copy_outputs_after_failure(spec: job_spec_pb2.JobSpec, work: Path, uid: int, check_url: UrlCheck, *,
                                     stores: ObjectStores) -> str:
    """After the command failed: for a job with `always_copy_outputs`, copy the outputs it left in `work` (in a
    thread), and return what to add to the attempt's message about those that could not be copied ("" when
    none). An output the command did not make is passed over: it failed before making it."""
    if not spec.always_copy_outputs or not spec.output_files:
        return ""
    try:
        problems = await asyncio.to_thread(_copy_outputs_left, spec, work, uid, check_url, stores)
    except Exception as e:  # noqa: BLE001 - the attempt ends as the command did; the copy's failure is said
        problems = [str(e)]
    return f"; output files not copied: {'; '.join(problems)}" if problems else ""


def _copy_outputs_left(spec: job_spec_pb2.JobSpec, work: Path, uid: int, check_url: UrlCheck,
                       stores: ObjectStores) -> list[str]:
    """`copy_outputs`, each output on its own: one not there is passed over, and one that cannot be copied
    does not stop the others. Returns why each of those could not be copied."""
    problems = []
    work_fd = os.open(work, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for f in spec.output_files:
            try:
                _copy_output(f, work_fd, uid, check_url, stores)
            except CopyRefused as e:
                if not _not_made(e):
                    problems.append(str(e))
    finally:
        os.close(work_fd)
    return problems


def _not_made(e: CopyRefused) -> bool:
    """Whether `_copy_output` refused because the output, or a directory on its way, is not there."""
    inner = e.__cause__
    return isinstance(inner, CopyRefused) and isinstance(inner.__cause__, FileNotFoundError)


def _copy_output(f: job_spec_pb2.OutputFile, work_fd: int, uid: int, check_url: UrlCheck,
                 stores: ObjectStores) -> None:
    try:
        check_url(f.to_url)
        target = stores.locate(f.to_url)
        parent_fd, name = _parent_beneath(work_fd, f.from_path, create=False)
        try:
            fd = _open_output(parent_fd, name, f.from_path)
        finally:
            os.close(parent_fd)
        _copy_out(fd, f.from_path, uid, target.fs, target.path, stores.timeout_s)
    except Exception as e:
        missing = None if _local(f.to_url) else f"the bucket or container of {f.to_url} does not exist"
        raise CopyRefused(f"{f.from_path} -> {f.to_url}: {_reason(e, missing, stores.timeout_s)}") from e


def _resolved(source: Location, check_url: UrlCheck) -> str:
    """A local source's real path; where a link leads must be allowed too."""
    real = os.path.realpath(source.path)
    if real != os.path.normpath(source.path):
        check_url(f"file://{real}")
    return real


def _local(url: str) -> bool:
    return urlsplit(url).scheme == "file"


def _reason(e: Exception, missing: str | None, timeout_s: float) -> str:
    """What went wrong, in one line (storage libraries' own messages can be a page long); `missing` says it
    when an object store answers "not found" (the libraries name the object without its scheme, if at all)."""
    if isinstance(e, CopyRefused):
        return str(e)
    if isinstance(e, FSTimeoutError):
        return (f"not done within {timeout_s:g} s (worker setting --storage-timeout): the object store is "
                "unreachable or too slow")
    if isinstance(e, FileNotFoundError) and missing is not None:
        return missing
    text = " ".join(str(e).split())
    return (text[:300] + "..." if len(text) > 300 else text) or type(e).__name__


def _fd_path(fd: int) -> str:
    """A path naming exactly the open file `fd`, for fsspec calls that take a path."""
    return f"/proc/self/fd/{fd}"


def _fetch(source: Location, parent_fd: int, name: str, timeout_s: float) -> None:
    """Copy an object, or every object below a prefix, from an object store to `name` in `parent_fd`."""
    try:
        info = source.fs.info(source.path, timeout=timeout_s)
    except FileNotFoundError:
        raise CopyRefused(f"{source.url} does not exist") from None
    if info["type"] != "directory":
        _fetch_file(source, source.path, parent_fd, name, timeout_s)
        return
    prefix = source.path.rstrip("/") + "/"
    try:
        os.mkdir(name, 0o700, dir_fd=parent_fd)
    except FileExistsError:
        pass
    dir_fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
    try:
        for key in sorted(source.fs.find(source.path, timeout=timeout_s)):
            relative = key[len(prefix):] if key.startswith(prefix) else ""
            if not relative or relative.endswith("/"):
                continue  # the prefix itself, or a marker some tools write for a "directory"
            if any(part in ("", ".", "..") for part in relative.split("/")):
                raise CopyRefused(f"object {key!r} has a name that is no path below {source.url}")
            inner_fd, inner_name = _parent_beneath(dir_fd, "/" + relative, create=True)
            try:
                _fetch_file(source, key, inner_fd, inner_name, timeout_s)
            finally:
                os.close(inner_fd)
    finally:
        os.close(dir_fd)


def _fetch_file(source: Location, key: str, parent_fd: int, name: str, timeout_s: float) -> None:
    target = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                     dir_fd=parent_fd)
    try:
        source.fs.get_file(key, _fd_path(target), timeout=timeout_s)
    finally:
        os.close(target)


def _parent_beneath(work_fd: int, container_path: str, create: bool,
                    made: list[str] | None = None) -> tuple[int, str]:
    """A descriptor of the directory holding `container_path` below the working directory, and the last
    component's name; each directory on the way is opened without following links (and made if `create`,
    its container path then appended to `made`)."""
    parts = PurePosixPath(posixpath.normpath(container_path)).parts[1:]
    fd = os.dup(work_fd)
    try:
        for i, part in enumerate(parts[:-1]):
            if create:
                try:
                    os.mkdir(part, 0o700, dir_fd=fd)
                    if made is not None:
                        made.append("/" + "/".join(parts[: i + 1]))
                except FileExistsError:
                    pass
            try:
                next_fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as e:
                where = container_path if e.errno == errno.ENOENT else "/" + "/".join(parts[: i + 1])
                raise CopyRefused(_describe(e, where)) from e
            os.close(fd)
            fd = next_fd
        return fd, parts[-1]
    except BaseException:
        os.close(fd)
        raise


def _describe(e: OSError, where: str) -> str:
    if e.errno in (errno.ELOOP, errno.ENOTDIR):
        return f"{where} is a symbolic link or not a directory; files are copied without following links"
    if e.errno == errno.ENOENT:
        return f"{where} does not exist"
    return f"{where}: {e.strerror}"


def _open_output(parent_fd: int, name: str, where: str) -> int:
    try:
        return os.open(name, _READ, dir_fd=parent_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise CopyRefused(f"{where} is a symbolic link; outputs are copied without following links") from e
        raise CopyRefused(_describe(e, where)) from e


def _copy_out(fd: int, where: str, uid: int, fs: fsspec.AbstractFileSystem, remote: str, timeout_s: float) -> None:
    """Copy the opened file or directory `fd` (closed here) to `remote`. Object stores have no directories
    to make (and a worker must not create buckets or containers)."""
    local = isinstance(fs, LocalFileSystem)
    try:
        st = os.fstat(fd)
        if not _readable_by(st, uid):
            raise CopyRefused(f"{where} is not readable by the job's user, so it is not copied")
        if stat.S_ISREG(st.st_mode) and local:
            fs.makedirs(posixpath.dirname(remote.rstrip("/")) or "/", exist_ok=True)
            with open(fd, "rb", closefd=False) as source, fs.open(remote, "wb") as target:
                shutil.copyfileobj(source, target)
        elif stat.S_ISREG(st.st_mode):
            fs.put_file(_fd_path(fd), remote, timeout=timeout_s)
        elif stat.S_ISDIR(st.st_mode):
            if local:
                fs.makedirs(remote, exist_ok=True)
            for entry in sorted(os.listdir(fd)):
                try:
                    child = os.open(entry, _READ, dir_fd=fd)
                except OSError as e:
                    if e.errno == errno.ELOOP:
                        raise CopyRefused(f"{where}/{entry} is a symbolic link; outputs are copied without "
                                          "following links") from e
                    raise CopyRefused(_describe(e, f"{where}/{entry}")) from e
                _copy_out(child, f"{where}/{entry}", uid, fs, f"{remote.rstrip('/')}/{entry}", timeout_s)
        else:
            raise CopyRefused(f"{where} is neither a regular file nor a directory")
    finally:
        os.close(fd)


def _readable_by(st: os.stat_result, uid: int) -> bool:
    """Whether the job's user (uid, and a group of the same number) could read it: a job may only export
    what it could read itself (a hard link to someone else's private file fails this)."""
    need = stat.S_IRUSR | (stat.S_IXUSR if stat.S_ISDIR(st.st_mode) else 0)
    if st.st_uid == uid:
        return st.st_mode & need == need
    if st.st_gid == uid:
        return st.st_mode & (need >> 3) == need >> 3
    return st.st_mode & (need >> 6) == need >> 6


def _copy_file_in(source: str, parent_fd: int, name: str) -> None:
    # Non-blocking, then checked: a FIFO already there (an image may ship one) must neither hang the copy
    # nor take the input. (A device node cannot be opened: the OCI runtime's root filesystems are nodev.)
    target = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     0o600, dir_fd=parent_fd)
    if not stat.S_ISREG(os.fstat(target).st_mode):
        os.close(target)
        raise CopyRefused(f"{name} is already there and not a regular file")
    os.set_blocking(target, True)
    with open(source, "rb") as src, open(target, "wb") as dst:
        shutil.copyfileobj(src, dst)
        os.fchmod(dst.fileno(), os.fstat(src.fileno()).st_mode & 0o777)  # keeps x bits, never setuid


def _copy_dir_in(source: str, parent_fd: int, name: str) -> None:
    try:
        os.mkdir(name, 0o700, dir_fd=parent_fd)
    except FileExistsError:
        pass
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
    try:
        with os.scandir(source) as entries:
            for entry in entries:
                if entry.is_symlink():
                    os.symlink(os.readlink(entry.path), entry.name, dir_fd=fd)
                elif entry.is_dir():
                    _copy_dir_in(entry.path, fd, entry.name)
                elif entry.is_file():
                    _copy_file_in(entry.path, fd, entry.name)
    finally:
        os.close(fd)
