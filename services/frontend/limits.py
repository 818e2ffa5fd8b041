"""Every limit a user of the frontend runs into, with its default, in one place.

An operator changes one with the flag of the same name
(`python -m services.frontend --max-query-bytes 16384`); docs/security.md
lists them all with the error each gives. Limits that a column's size
fixes (a VARCHAR(100) holds 100 characters) are not settings: they are in
`services.frontend.field_limits`, checked against the schema by the tests.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
from typing import Any

from services.frontend import query


@dataclasses.dataclass(frozen=True)
class Limits:
    """The frontend's limits on what one request, or one user, may ask for."""

    # -- the query language (ListBatches, ListJobs, WatchBatch) ----------------

    max_query_bytes: int = query.MAX_BYTES
    """Longest query, in UTF-8 bytes. A longer one is INVALID_ARGUMENT on `query`."""
    max_query_terms: int = query.MAX_TERMS
    """Most terms in one query; each becomes a subquery of the statement."""

    # -- time --------------------------------------------------------------------

    max_statement_time_s: float = 5.0
    """Longest one read statement of a user's request may run (MariaDB's max_statement_time,
    per statement); a read killed by it is RESOURCE_EXHAUSTED."""
    rpc_deadline_s: float = 60.0
    """Longest a unary call may take on the server, whatever deadline the client set
    (DEADLINE_EXCEEDED); server streams are exempt, bounded by the two limits below."""

    # -- streams and messages ----------------------------------------------------

    max_streams_per_user: int = 16
    """Server streams (WatchBatch, WatchSpend, StreamJobLog) one caller may hold open at once
    on one frontend replica; one more is RESOURCE_EXHAUSTED."""
    max_request_bytes: int = 4 * 1024 * 1024
    """Largest serialized request gRPC accepts (RESOURCE_EXHAUSTED beyond); AddJobs bunches
    must fit."""

    # -- one user's share of a frontend replica (services.frontend.quotas) ---------

    max_requests_per_user_per_s: float = 50.0
    """Calls one user may make to one frontend replica a second, sustained (a token bucket; every call
    counts, stream openings too); past it RESOURCE_EXHAUSTED with a RetryInfo saying when to retry."""
    max_request_burst_per_user: int = 100
    """Calls one user may make at once after a quiet time (the bucket's size)."""
    max_concurrent_reads_per_user: int = 2
    """Reads (unary calls that change nothing: GetBatch, ListJobs, ...) one user may have running at
    once on one frontend replica; one more is RESOURCE_EXHAUSTED. Two keep the other tenants' reads
    fast on two cores when every read is a 32-term query over 100,000 jobs (docs/security.md)."""
    max_submissions_per_user_per_minute: int = 60
    """New batches and updates (CreateBatch, SubmitBatch, CreateUpdate, RerunFailedJobs) one user may
    start on one frontend replica a minute, all of them at once after a quiet minute (a token bucket);
    past it RESOURCE_EXHAUSTED with a RetryInfo."""

    # -- submissions -------------------------------------------------------------

    max_jobs_per_bunch: int = 5_000
    """Jobs in one AddJobs or SubmitBatch call; a bigger submission goes up in several bunches."""
    max_job_groups_per_bunch: int = 5_000
    """Job groups in one CreateJobGroups or SubmitBatch call."""
    max_spec_bytes: int = 256 * 1024
    """One job's spec, serialized."""
    max_cores_mcpu: int = 64_000
    """Most cores one job may ask for, in thousandths of a core."""
    max_registries_per_request: int = 16
    """Registries the jobs of one AddJobs or SubmitBatch call may name (bare image names, which the default
    registry serves, aside): each is resolved at submission."""

    # -- lists in one job spec (and in a batch's or group's attributes) ---------

    max_parents_per_job: int = 10_000
    """Entries in a spec's `parents`."""
    max_env_per_job: int = 1_000
    """Entries in a spec's `env`."""
    max_attributes: int = 100
    """Attributes of one batch, job group or job."""
    max_files_per_job: int = 1_000
    """Entries in a spec's `input_files`, and again in its `output_files`."""
    max_regions_per_job: int = 64
    """Entries in a spec's `regions`."""
    max_held_jobs_per_batch: int = 1_000
    """Jobs of one batch held one by one (HoldJobs with a job_id); more are held as a job group, one row."""
    max_locks_per_job: int = 64
    """Entries in a spec's `locks`."""
    max_names_per_lock: int = 1_000
    """Resource names in one lock."""
    max_secrets_per_job: int = 64
    """Entries in a spec's `secrets`."""
    max_members_per_request: int = 1_000
    """Usernames in one CreateBillingProject call."""

    # -- secrets (SecretService) --------------------------------------------------

    max_secret_files: int = 64
    """Files in one secret (CreateSecret's `files`)."""
    max_secret_bytes: int = 65_536
    """Bytes of one secret's contents, its files together (so also of any one file)."""

    # -- images (ImageService: `corral images import`) -----------------------------

    max_image_import_bytes: int = 4 * 1024**3
    """Bytes of one imported image archive (ImportImage); one more is RESOURCE_EXHAUSTED. The frontend
    holds the archive in a temporary file while it copies it into the registry."""
    max_image_layers: int = 128
    """Layers of one imported image; more is INVALID_ARGUMENT (squash the image)."""
    max_image_import_s: float = 1800.0
    """Longest one import may take, receiving the archive and copying it into the registry
    (DEADLINE_EXCEEDED)."""
    max_concurrent_image_imports: int = 2
    """Imports one frontend replica runs at once, whoever sends them (each holds an archive on its
    disk); one more is RESOURCE_EXHAUSTED, to be tried again."""

    # -- work: how much one batch, user or project may hold ----------------------

    max_jobs_per_batch: int = 1_000_000
    """Jobs one batch may hold, every update's reserved ids together: CreateBatch, CreateUpdate,
    SubmitBatch or RerunFailedJobs past it is INVALID_ARGUMENT."""
    max_open_jobs_per_user: int = 2_000_000
    """Jobs not final yet that one user may have in their open and running batches (ids reserved
    by an update count); a reservation past it is RESOURCE_EXHAUSTED."""
    max_open_jobs_per_billing_project: int = 5_000_000
    """The same for all the batches of one billing project."""
    max_children_per_job: int = 100_000
    """Jobs that may depend on one job (its fan-out): AddJobs, SubmitBatch or RerunFailedJobs past
    it is INVALID_ARGUMENT. Completing a parent releases its children in chunks, so up to
    1,000,000 is safe (docs/performance.md, fanout)."""

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is not None and value <= 0:  # None, where a field allows it: no limit
                raise ValueError(f"{field.name} must be positive, not {value!r}")

    @classmethod
    def flag(cls, name: str) -> str:
        """The command-line flag that sets field `name`, e.g. --max-query-bytes."""
        return "--" + name.replace("_", "-")

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser) -> None:
        """One flag per field, its help the field's docstring."""
        group = parser.add_argument_group("limits", "what one request or one user may ask for (docs/security.md)")
        for field in dataclasses.fields(cls):
            number = float if "float" in str(field.type) else int
            group.add_argument(cls.flag(field.name), dest=field.name, type=number, default=field.default,
                               help=f"{field_docs()[field.name]} (default: %(default)s)")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Limits:
        """The limits that `add_flags`' flags parsed into."""
        return cls(**{field.name: getattr(args, field.name) for field in dataclasses.fields(cls)})


@functools.cache
def field_docs() -> dict[str, str]:
    """Each field of Limits and the docstring under it, on one line."""
    tree = ast.parse(inspect.getsource(Limits))
    body: list[Any] = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for field, doc in zip(body, body[1:]):
        if isinstance(field, ast.AnnAssign) and isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant):
            docs[field.target.id] = " ".join(str(doc.value.value).split())  # type: ignore[union-attr]
    return docs
