"""An attempt's secrets on the worker: delivered by the driver with the
RunJob, kept as read-only files while the attempt runs, removed when it
ends.

Each secret becomes a directory of its own below the attempt's directory
(`ATTEMPT/secrets/0`, ...), 0500, with a file per key, 0400, all owned by
the job's uid; a runtime then mounts that directory read-only where the job
sees `mount_path` (the process runtime with a bind mount in the job's mount
namespace, jobinit.py; a container runtime in its bundle's mounts). The
attempt's directory is the worker's, 0700, and hidden from the job but for
its own `work/` and `tmp/`: only the mount shows the files.

`write_secret_dir` is the piece every runtime shares. Nothing here logs or
returns a file's contents; a refusal names the secret and why, never what
it holds.

The secret a job pulls its image with (spec.image_pull_secret) is not one
of these: it is never written here (services/worker/pull_secrets.py).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from corral.batch.v1 import job_spec_pb2
from corral.driver.v1 import worker_session_pb2 as ws
from services.worker.job_files import host_path
from services.worker.runtime_api import SecretVolume

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _plain_name(name: str) -> bool:
    """A name that is one path component (the frontend allowed only [A-Za-z0-9._-], checked again here)."""
    return bool(name) and name not in (".", "..") and "/" not in name and "\0" not in name


def delivered_secrets(spec: job_spec_pb2.JobSpec, delivered: Sequence[ws.SecretFiles]
                      ) -> tuple[tuple[SecretVolume, ...], list[str]]:
    """The secrets of `spec` as the driver delivered them (RunJob.secrets), and why the attempt cannot run
    with them: one the driver could not deliver (its error), one missing or not matching the spec's mount,
    a file name that is not a plain name."""
    refusals = []
    volumes = []
    for i, mount in enumerate(spec.secrets):
        got = delivered[i] if i < len(delivered) else None
        if got is None or (got.name, got.mount_path) != (mount.name, mount.mount_path):
            refusals.append(f"secret {mount.name!r} was not delivered with the job")
        elif got.error:
            refusals.append(got.error)
        elif bad := sorted(name for name in got.files if not _plain_name(name)):
            refusals.append(f"secret {mount.name!r} has a file whose name is not a plain file name ({bad[0]!r})")
        else:
            volumes.append(SecretVolume(mount.name, mount.mount_path, dict(got.files)))
    return tuple(volumes), refusals


def write_secret_dir(directory: Path, files: Mapping[str, bytes], uid: int, gid: int) -> None:
    """Make `directory` (new; its parent the worker's own) hold `files` as read-only files of uid:gid: each
    file 0400, the directory 0500 once they are in. Nothing is followed: the directory is made here, and each
    file created with O_EXCL and O_NOFOLLOW."""
    directory.mkdir(mode=0o700)
    directory_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for name, content in files.items():
            if not _plain_name(name):
                raise ValueError(f"{name!r} is not a plain file name")
            fd = os.open(name, _CREATE, 0o400, dir_fd=directory_fd)
            try:
                view = memoryview(content)
                while view:
                    view = view[os.write(fd, view):]
                os.fchmod(fd, 0o400)
                os.fchown(fd, uid, gid)
            finally:
                os.close(fd)
        os.fchmod(directory_fd, 0o500)
        os.fchown(directory_fd, uid, gid)
    finally:
        os.close(directory_fd)


def place_secrets(secrets: Sequence[SecretVolume], secrets_dir: Path, work: Path, uid: int, gid: int
                  ) -> tuple[tuple[str, str], ...]:
    """Write each secret into a directory of its own in `secrets_dir` (new, 0700: the worker's; beside the
    job's working directory `work`, hidden from the job) and return, for each, (that directory, its mount
    point below `work`): what the process runtime mounts read-only, the mount points already made."""
    secrets_dir.mkdir(mode=0o700)
    binds = []
    for i, secret in enumerate(secrets):
        write_secret_dir(secrets_dir / str(i), secret.files, uid, gid)
        binds.append((str(secrets_dir / str(i)), str(host_path(work, secret.mount_path))))
    return tuple(binds)


def remove_secret_dirs(secrets_dir: Path) -> None:
    """Remove an attempt's secrets (the worker, root, removes 0500 directories of others' uids alike)."""
    shutil.rmtree(secrets_dir, ignore_errors=True)


def remove_leftover_secrets(scratch: Path) -> int:
    """Remove the secrets a worker that died left in its scratch root (each attempt's `secrets/`): when a
    worker starts, no attempt of it runs. Returns how many attempts had some."""
    removed = 0
    if scratch.is_dir():
        for attempt_dir in scratch.iterdir():
            secrets_dir = attempt_dir / "secrets"
            if attempt_dir.is_dir() and not attempt_dir.is_symlink() and secrets_dir.is_dir():
                remove_secret_dirs(secrets_dir)
                removed += 1
    return removed
