"""Live worker sessions: where Run and Cancel commands go.

Each connected worker has one `Session`: a queue of commands the driver's
WorkerSession handler streams down to it. The registry is the scheduler's
`Dispatcher`: putting a command on a queue never waits on the worker, so a
slow worker cannot hold up a scheduling cycle.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from google.protobuf import timestamp_pb2

from corral.batch.v1 import job_spec_pb2
from corral.driver.v1 import driver_service_pb2 as pb
from corral.driver.v1 import worker_session_pb2 as ws
from services.common.telemetry import context_from_json
from services.common.urls import StorageRoots
from services.db.store import wall_clock_ms
from services.driver.scheduler import Placement
from services.driver.secret_delivery import JobSecrets, SecretDelivery
from services.driver.store import DriverStore
from services.common.specs import SpecStore

RUN_DEADLINE_MS = 60_000
"""A Run command not started by then is refused by the worker."""


def instance_token(activation_token: str) -> str:
    """The session token of an activated instance, derived from its (secret)
    activation token so every driver can check it without storing more."""
    return hmac.new(activation_token.encode(), b"corral worker session", hashlib.sha256).hexdigest()


@dataclasses.dataclass
class Session:
    """One worker's connection."""

    instance: str
    commands: asyncio.Queue[pb.WorkerSessionResponse | None] = dataclasses.field(default_factory=asyncio.Queue)
    """What goes down to the worker; None ends the session (`end_reason` says why)."""
    draining: bool = False
    """The worker said Draining: it takes no new jobs, so none are scheduled on it."""
    end_reason: str = ""
    """Why the driver ended the session (it no longer leads), once it did."""
    heard_at: float = dataclasses.field(default_factory=time.monotonic)
    """When the worker last sent anything on it (this process's monotonic clock)."""
    image_names: frozenset[str] = frozenset()
    """The names (references, digests) of the images the worker's cache holds, as it last reported."""
    images: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    """The same report by digest: each image's references any job may run it by (`reported_images`)."""


MAX_REPORTED_IMAGES = 64
"""Images of a worker's ImageCacheReport kept at most (the worker sends no more)."""
MAX_REPORTED_NAMES = 16
"""Names of one reported image kept at most."""
MAX_IMAGE_NAME_CHARS = 255
"""A longer reported name is dropped: no job's recorded image is longer (jobs.image)."""


def reported_names(report: ws.ImageCacheReport) -> frozenset[str]:
    """Every name a worker's image cache report gives its images (their digests too), within the bounds."""
    names: set[str] = set()
    for image in report.images[:MAX_REPORTED_IMAGES]:
        names.update(n for n in [image.digest, *image.names[:MAX_REPORTED_NAMES]] if 0 < len(n) <= MAX_IMAGE_NAME_CHARS)
    return frozenset(names)


def reported_images(report: ws.ImageCacheReport) -> dict[str, tuple[str, ...]]:
    """A worker's image cache report by digest: each image's public references (CachedImage.public_references),
    within the bounds. A reference naming corral's registry (`localhost/...`) is dropped whatever the worker
    says: it is a project's image, private to its members."""
    images: dict[str, tuple[str, ...]] = {}
    for image in report.images[:MAX_REPORTED_IMAGES]:
        if 0 < len(image.digest) <= MAX_IMAGE_NAME_CHARS:
            images[image.digest] = tuple(r for r in image.public_references[:MAX_REPORTED_NAMES]
                                         if 0 < len(r) <= MAX_IMAGE_NAME_CHARS and not r.startswith("localhost/"))
    return images


class SessionRegistry:
    """The sessions of this driver; implements the scheduler's Dispatcher."""

    def __init__(self, store: DriverStore, specs: SpecStore, clock_ms: Callable[[], int] = wall_clock_ms,
                 log_root_url: str = "", storage_roots: StorageRoots = StorageRoots(),
                 secrets: SecretDelivery | None = None):
        self._store = store
        self._specs = specs
        self._secrets = secrets or SecretDelivery(store, None)
        self._log_root_url = log_root_url.rstrip("/")
        self._storage_roots = storage_roots
        self._sessions: dict[str, Session] = {}
        self._command_ids = itertools.count(1)
        self._clock_ms = clock_ms

    def open(self, instance: str) -> Session:
        """A new session for `instance`, replacing an older one (a reconnect)."""
        session = Session(instance)
        self._sessions[instance] = session
        return session

    def close(self, session: Session) -> None:
        if self._sessions.get(session.instance) is session:
            del self._sessions[session.instance]

    def end_all(self, reason: str) -> int:
        """End every session (this driver no longer leads): each worker is told `reason` and looks for
        the leader. Returns how many were ended."""
        sessions = list(self._sessions.values())
        self._sessions.clear()
        for session in sessions:
            session.end_reason = reason
            session.commands.put_nowait(None)
        return len(sessions)

    def live_instances(self) -> set[str]:
        """Instances whose worker holds a session and takes jobs (not draining): where the
        scheduler may place jobs."""
        return {name for name, session in self._sessions.items() if not session.draining}

    def images_held(self) -> dict[str, frozenset[str]]:
        """Per connected instance, the names of the images its worker's cache holds (as it last reported)."""
        return {name: session.image_names for name, session in self._sessions.items() if session.image_names}

    def image_reports(self) -> dict[str, Mapping[str, tuple[str, ...]]]:
        """Per connected instance, the images its worker's cache holds by digest (`Session.images`)."""
        return {name: session.images for name, session in self._sessions.items()}

    def connected_instances(self) -> set[str]:
        """Instances whose worker holds a session, draining or not: where commands such as
        CancelJob reach."""
        return set(self._sessions)

    def heard_from(self, within_s: float) -> set[str]:
        """Instances whose worker holds a session and sent something on it within `within_s`. A session
        can outlive its worker's reach: cut off by a partition, its connection stays open here until
        the transport notices, which may take hours."""
        since = time.monotonic() - within_s
        return {name for name, session in self._sessions.items() if session.heard_at >= since}

    def log_url(self, batch_id: int, job_id: int, attempt_id: str) -> str:
        """Where the worker uploads an attempt's main log (the frontend reads finished logs there);
        empty without a root, and the worker uses its own."""
        if not self._log_root_url:
            return ""
        return f"{self._log_root_url}/logs/{batch_id}/{job_id}/{attempt_id}/main.log"

    def send(self, instance: str, command: pb.WorkerSessionResponse) -> bool:
        """Queue a command for a connected worker; False if it has no session."""
        session = self._sessions.get(instance)
        if session is None:
            return False
        command.command_id = next(self._command_ids)
        session.commands.put_nowait(command)
        return True

    async def run(self, placements: Sequence[Placement]) -> None:
        """Send a RunJob per placement, with the job's spec, accounting and secrets."""
        if not placements:
            return
        # The scheduler's placements carry what SJ returned; others (RunJob sent again) are read here.
        details = {(p.batch_id, p.job_id): p.run for p in placements if p.run is not None}
        unread = [p for p in placements if p.run is None]
        if unread:
            details.update(await self._run_details(unread))
        deadline = timestamp_pb2.Timestamp()
        deadline.FromMilliseconds(self._clock_ms() + RUN_DEADLINE_MS)
        specs = await self._specs.read_many([row["spec_ref"] for row in details.values()])
        # Opened here, sent below and kept nowhere (services.driver.secret_delivery).
        using = [(p.batch_id, p.job_id) for p in placements
                 if (spec := specs[details[(p.batch_id, p.job_id)]["spec_ref"]]).secrets or spec.image_pull_secret]
        opened = await self._secrets.files([(details[key]["billing_project"], specs[details[key]["spec_ref"]])
                                            for key in using])
        job_secrets = dict(zip(using, opened))
        for p in placements:
            row = details[(p.batch_id, p.job_id)]
            spec = specs[row["spec_ref"]]
            if row["timeout_ms"] is None and row["budget_timeout_ms"] is not None:
                # A project with a limit reserved the cost of its longest job: the job is stopped after it.
                spec = job_spec_pb2.JobSpec.FromString(spec.SerializeToString())
                spec.timeout.FromMilliseconds(int(row["budget_timeout_ms"]))
            delivered = job_secrets.get((p.batch_id, p.job_id), JobSecrets([]))
            self.send(p.instance, pb.WorkerSessionResponse(run_job=ws.RunJob(
                attempt=ws.AttemptRef(batch_id=p.batch_id, job_id=p.job_id, attempt_id=p.attempt_id),
                user=row["user"], billing_project=row["billing_project"], spec=spec, cores_mcpu=p.cores_mcpu,
                memory_bytes=row["memory_bytes"], storage_bytes=row["storage_bytes"], deadline=deadline,
                log_url=self.log_url(p.batch_id, p.job_id, p.attempt_id),
                trace_context=context_from_json(row["trace_context"]),
                storage_roots=self._storage_roots.for_project(row["billing_project"]),
                secrets=delivered.mounts, image_pull_secret=delivered.image_pull)))

    async def _run_details(self, placements: Sequence[Placement]) -> dict[tuple[int, int], Mapping[str, Any]]:
        """What a Run command needs of each job, read (as SJ returns it)."""
        return await self._store.run_details([(p.batch_id, p.job_id) for p in placements])

    def cancel(self, instance: str, batch_id: int, job_id: int, attempt_id: str, reason: str) -> bool:
        """Ask a worker to stop an attempt."""
        return self.send(instance, pb.WorkerSessionResponse(cancel_job=ws.CancelJob(
            attempt=ws.AttemptRef(batch_id=batch_id, job_id=job_id, attempt_id=attempt_id), reason=reason)))
