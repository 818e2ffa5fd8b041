"""A job's secrets, opened for the attempt the driver sends to a worker.

The drivers are the only processes that hold the private key of the
deployment's key pair for job secrets (--secrets-key-file;
services.common.sealing). For each RunJob whose spec mounts secrets or
pulls its image with one (image_pull_secret), the driver reads the boxes of
the batch's billing project, opens each (a box opens only for its own row)
and sends the files in RunJob.secrets and RunJob.image_pull_secret, down
the worker's mutual-TLS session and nowhere else: nothing here logs, stores
or keeps them. A secret that cannot be delivered (deleted after the job was
submitted, sealed with another key, or this driver given no key) goes as its
error instead, and the worker ends the attempt in Error, refused, with those
words (no retry: it would fail the same way).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from corral.batch.v1 import job_spec_pb2
from corral.driver.v1 import worker_session_pb2 as ws
from services.common.sealing import Opener, SealError, secret_row, unpack_files
from services.driver.store import DriverStore, SealedSecret


MAX_BYTES_PER_JOB = 1024 * 1024
"""The most bytes of secrets one job may mount, all its secrets together. A RunJob is one message of the
worker's session, which takes 4 MiB: 64 secrets of 64 KiB each (what submission allows) would pass that and
break the session, again at each re-send, so such a job is refused instead."""


def _reference(name: str, billing_project: str) -> tuple[str, str]:
    """(project, secret) of a mount's name: 'NAME' is the batch's project's, 'PROJECT/NAME' names one."""
    project, _, secret = name.rpartition("/")
    return project or billing_project, secret


@dataclasses.dataclass(frozen=True)
class JobSecrets:
    """What a RunJob carries of its job's secrets."""

    mounts: list[ws.SecretFiles]
    """RunJob.secrets: one per spec.secrets entry, in its order."""
    image_pull: ws.SecretFiles | None = None
    """RunJob.image_pull_secret: the secret spec.image_pull_secret names; None when it names none."""


class SecretDelivery:
    """Opens the secrets of the jobs a driver sends (see the module docstring)."""

    def __init__(self, store: DriverStore, opener: Opener | None, max_bytes_per_job: int = MAX_BYTES_PER_JOB):
        self._store = store
        self._opener = opener
        """None: this driver was given no key, and delivers no secret."""
        self._max_bytes_per_job = max_bytes_per_job

    async def files(self, jobs: Sequence[tuple[str, job_spec_pb2.JobSpec]]) -> list[JobSecrets]:
        """For each (billing project, spec), the secrets it mounts and pulls its image with, read in one query."""
        wanted = sorted({(project, secret) for billing_project, spec in jobs for written in _names(spec)
                         for project, secret in [_reference(written, billing_project)] if project == billing_project})
        rows = {}
        if wanted and self._opener is not None:
            rows = await self._store.sealed_secrets(wanted)
        return [self._limited(JobSecrets(
                    [self._one(billing_project, mount.name, mount.mount_path, rows) for mount in spec.secrets],
                    self._one(billing_project, spec.image_pull_secret, "", rows) if spec.image_pull_secret else None))
                for billing_project, spec in jobs]

    def _limited(self, delivered: JobSecrets) -> JobSecrets:
        """A job's secrets, or only errors if together they hold more than a job may mount."""
        every = delivered.mounts + ([delivered.image_pull] if delivered.image_pull is not None else [])
        total = sum(len(content) for secret in every for content in secret.files.values())
        if total <= self._max_bytes_per_job:
            return delivered

        def refused(s: ws.SecretFiles) -> ws.SecretFiles:
            return ws.SecretFiles(name=s.name, mount_path=s.mount_path,
                                  error=f"the job's secrets hold {total:,} bytes together, more than the "
                                        f"{self._max_bytes_per_job:,} one job may mount")

        return JobSecrets([refused(s) for s in delivered.mounts],
                          refused(delivered.image_pull) if delivered.image_pull is not None else None)

    def _one(self, billing_project: str, written: str, mount_path: str,
             rows: dict[tuple[str, str], SealedSecret]) -> ws.SecretFiles:
        delivered = ws.SecretFiles(name=written, mount_path=mount_path)
        project, name = _reference(written, billing_project)
        if project != billing_project:  # the frontend refuses these; never deliver one
            delivered.error = f"secret {written!r} is not of the job's billing project {billing_project!r}"
        elif self._opener is None:
            delivered.error = ("the driver has no key to open secrets with (operator setting --secrets-key-file), "
                               f"so secret {name!r} cannot be delivered")
        elif (row := rows.get((project, name))) is None:
            delivered.error = (f"secret {name!r} of billing project {project!r} no longer exists: it was deleted "
                               "after the job was submitted")
        elif row.key_id != self._opener.key_id:
            delivered.error = (f"secret {name!r} was sealed with key {row.key_id}, not this deployment's "
                               f"({self._opener.key_id}): create it again")
        else:
            try:
                delivered.files.update(unpack_files(self._opener.open(row.sealed,
                                                                      secret_row(project, name))))
            except SealError as e:
                delivered.error = f"secret {name!r} could not be opened: {e}"
        return delivered


def _names(spec: job_spec_pb2.JobSpec) -> list[str]:
    """The secrets a spec names, as written: those it mounts, then the one it pulls its image with."""
    return [m.name for m in spec.secrets] + ([spec.image_pull_secret] if spec.image_pull_secret else [])
