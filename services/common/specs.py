"""Job specs in blob storage, one object per bunch.

The database keeps what scheduling and listing need; the full spec (image,
command, env, files, ...) goes to storage, written once per AddJobs bunch
as a serialized `AddJobsRequest` holding the bunch's specs, before the
jobs are inserted (so no job ever refers to a missing spec). A job's
`spec_ref` is `<object path>#<index in bunch>`; the object is named by the
bunch's first job id and a digest of its content and written only if
absent: a re-sent bunch writes nothing new, and a different bunch sent for
the same ids never replaces the specs the jobs were accepted with. When
the database refuses a bunch, the object its call created is removed
(`discard`). Any fsspec URL works: `file://` under the data directory by default, `gs://` or `az://` in a
cloud (with the matching fsspec package installed).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import posixpath

import fsspec

from corral.batch.v1 import batch_service_pb2 as pb
from corral.batch.v1 import job_spec_pb2

DIGEST_CHARS = 16
"""Hex digits of the SHA-256 of a bunch's content in its object's name."""


@dataclasses.dataclass(frozen=True)
class StoredBunch:
    """Where a bunch's specs are, and whether this call created the object."""

    path: str
    refs: list[str]
    """The spec_ref of each job, in order."""
    created: bool
    """False when the object was there already (the same bunch, sent before)."""


class SpecStore:
    """Writes and reads bunches of job specs under a root URL."""

    def __init__(self, root_url: str):
        self._fs, self._root = fsspec.core.url_to_fs(root_url)
        self._protocol = root_url.split("://", 1)[0] if "://" in root_url else "file"

    def _path(self, batch_id: int, update_id: int, first_job_id: int, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()[:DIGEST_CHARS]
        return posixpath.join(self._root, "specs", str(batch_id), str(update_id), f"{first_job_id}-{digest}.binpb")

    def _write_if_absent(self, path: str, data: bytes) -> bool:
        if self._fs.exists(path):
            return False
        self._fs.makedirs(posixpath.dirname(path), exist_ok=True)
        with self._fs.open(path, "wb") as f:
            f.write(data)
        return True

    async def store_bunch(self, batch_id: int, update_id: int, first_job_id: int,
                          specs: list[job_spec_pb2.JobSpec]) -> StoredBunch:
        """Store a bunch (unless this very bunch is stored already)."""
        data = pb.AddJobsRequest(batch_id=batch_id, update_id=update_id, jobs=specs).SerializeToString()
        path = self._path(batch_id, update_id, first_job_id, data)
        created = await asyncio.to_thread(self._write_if_absent, path, data)
        return StoredBunch(path, [f"{self._protocol}://{path}#{i}" for i in range(len(specs))], created)

    async def write_bunch(self, batch_id: int, update_id: int, first_job_id: int,
                          specs: list[job_spec_pb2.JobSpec]) -> list[str]:
        """Store a bunch; returns the spec_ref of each job."""
        return (await self.store_bunch(batch_id, update_id, first_job_id, specs)).refs

    async def discard(self, stored: StoredBunch) -> None:
        """Remove a bunch this call stored, after the database refused its jobs."""
        if stored.created:
            await asyncio.to_thread(self._fs.rm_file, stored.path)

    def _load(self, path: str) -> pb.AddJobsRequest:
        with self._fs.open(path, "rb") as f:
            return pb.AddJobsRequest.FromString(f.read())

    @staticmethod
    def _split(spec_ref: str) -> tuple[str, int]:
        url, _, index = spec_ref.rpartition("#")
        return (url.split("://", 1)[1] if "://" in url else url), int(index)

    async def read(self, spec_ref: str) -> job_spec_pb2.JobSpec:
        """The spec a spec_ref points at."""
        path, index = self._split(spec_ref)
        return (await asyncio.to_thread(self._load, path)).jobs[index]

    async def read_many(self, spec_refs: list[str]) -> dict[str, job_spec_pb2.JobSpec]:
        """The specs of many refs, reading each bunch object once (a bunch holds
        up to thousands of jobs, and the scheduler places neighbours together)."""
        by_path: dict[str, list[tuple[str, int]]] = {}
        for ref in spec_refs:
            path, index = self._split(ref)
            by_path.setdefault(path, []).append((ref, index))

        def load_all() -> dict[str, job_spec_pb2.JobSpec]:
            found = {}
            for path, wanted in by_path.items():
                bunch = self._load(path)
                for ref, index in wanted:
                    found[ref] = bunch.jobs[index]
            return found

        return await asyncio.to_thread(load_all)
