"""Job specs in blob storage, one object per bunch.

The database keeps what scheduling and listing need; the full spec (image,
command, env, files, ...) goes to storage, written once per AddJobs bunch
as a serialized `AddJobsRequest` holding the bunch's specs. A job's
`spec_ref` is `<object path>#<index in bunch>`. Any fsspec URL works:
`file://` under the data directory by default, `gs://` or `az://` in a
cloud (with the matching fsspec package installed).
"""

from __future__ import annotations

import asyncio
import posixpath

import fsspec

from corral.batch.v1 import batch_service_pb2 as pb
from corral.batch.v1 import job_spec_pb2


class SpecStore:
    """Writes and reads bunches of job specs under a root URL."""

    def __init__(self, root_url: str):
        self._fs, self._root = fsspec.core.url_to_fs(root_url)
        self._protocol = root_url.split("://", 1)[0] if "://" in root_url else "file"

    def _path(self, batch_id: int, update_id: int, first_job_id: int) -> str:
        return posixpath.join(self._root, "specs", str(batch_id), str(update_id), f"{first_job_id}.binpb")

    def _write(self, path: str, data: bytes) -> None:
        self._fs.makedirs(posixpath.dirname(path), exist_ok=True)
        with self._fs.open(path, "wb") as f:
            f.write(data)

    async def write_bunch(self, batch_id: int, update_id: int, first_job_id: int,
                          specs: list[job_spec_pb2.JobSpec]) -> list[str]:
        """Store a bunch; returns the spec_ref of each job. Rewriting is harmless:
        a re-sent bunch has the same ids and the same content."""
        path = self._path(batch_id, update_id, first_job_id)
        data = pb.AddJobsRequest(batch_id=batch_id, update_id=update_id, jobs=specs).SerializeToString()
        await asyncio.to_thread(self._write, path, data)
        return [f"{self._protocol}://{path}#{i}" for i in range(len(specs))]

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
