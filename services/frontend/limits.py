"""Every limit a user of the frontend runs into, with its default, in one place.

An operator changes one with the flag of the same name
(`python -m services.frontend --max-children-per-job 1000000`);
docs/security.md lists them all with the error each gives.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
from typing import Any


@dataclasses.dataclass(frozen=True)
class Limits:
    """The frontend's limits on what one request, or one user, may ask for."""

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
            if getattr(self, field.name) <= 0:
                raise ValueError(f"{field.name} must be positive, not {getattr(self, field.name)!r}")

    @classmethod
    def flag(cls, name: str) -> str:
        """The command-line flag that sets field `name`, e.g. --max-jobs-per-batch."""
        return "--" + name.replace("_", "-")

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser) -> None:
        """One flag per field, its help the field's docstring."""
        group = parser.add_argument_group("limits", "what one request or one user may ask for (docs/security.md)")
        for field in dataclasses.fields(cls):
            group.add_argument(cls.flag(field.name), dest=field.name, type=type(field.default),
                               default=field.default, help=f"{field_docs()[field.name]} (default: %(default)s)")

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
