"""The URLs of a submission, checked before anything is written: job files
against the billing project's storage roots, the callback against the
callback rules with its host resolved (see services/common/urls.py)."""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from corral.batch.v1 import job_spec_pb2 as spec_pb
from services.common.callback_hosts import Resolve, SystemResolver, Unresolved, checked_addresses
from services.common.errors import FieldViolation, InvalidRequest, RequestError
from services.common.urls import CallbackRules, RefusedUrl, StorageRoots, storage_url_problem


class ResolverUnavailable(RequestError):
    """DNS did not answer in time (or failed for now): the submission may be tried again."""

    code = grpc.StatusCode.UNAVAILABLE


def file_url_violations(spec: spec_pb.JobSpec, roots: Sequence[str], project: str, at: str) -> list[FieldViolation]:
    """A violation per input or output file URL of `spec` outside `roots` (the project's storage roots)."""
    violations = []
    for kind, files, attribute in (("input_files", spec.input_files, "from_url"),
                                   ("output_files", spec.output_files, "to_url")):
        for i, f in enumerate(files):
            if problem := storage_url_problem(getattr(f, attribute), roots, project):
                violations.append(FieldViolation(f"{at}.{kind}[{i}].{attribute}", problem))
    return violations


class UrlChecks:
    """What the frontend checks users' URLs against: the operator's settings."""

    def __init__(self, storage: StorageRoots = StorageRoots(), callbacks: CallbackRules = CallbackRules(),
                 resolve: Resolve | None = None):
        self.storage = storage
        self.callbacks = callbacks
        self._resolve = resolve if resolve is not None else SystemResolver()

    def storage_roots(self, project: str) -> tuple[str, ...]:
        """The storage roots of a billing project's jobs' files."""
        return self.storage.for_project(project)

    async def check_callback(self, url: str, field: str = "callback_url") -> None:
        """Raise InvalidRequest if `url` may not be a callback target (its host resolved now; the
        driver checks again when it sends), ResolverUnavailable if DNS did not answer in time."""
        try:
            await checked_addresses(url, self.callbacks, self._resolve)
        except RefusedUrl as e:
            raise InvalidRequest(FieldViolation(field, str(e))) from None
        except Unresolved as e:
            if e.transient:
                raise ResolverUnavailable(f"{field}: {e}; try again") from None
            raise InvalidRequest(FieldViolation(field, str(e))) from None
