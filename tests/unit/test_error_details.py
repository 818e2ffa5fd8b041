"""A refusal's field violations fit in what a gRPC client takes: a status
is sent base64-encoded in a trailer, and clients take 8 KiB of metadata by
default (a larger one reached them as RESOURCE_EXHAUSTED instead of the
INVALID_ARGUMENT it was)."""

from __future__ import annotations

import base64

from services.common.errors import MAX_DETAIL_BYTES, InvalidRequest, bad_request, to_status
from services.common.fields import FieldViolation


def test_the_first_violations_are_kept_and_the_rest_counted() -> None:
    many = [FieldViolation(f"jobs[{i}].secrets[0].name", "billing project proj has no secret 'x'")
            for i in range(5000)]
    bad = bad_request(many)
    assert bad.ByteSize() <= MAX_DETAIL_BYTES
    shown = bad.field_violations[:-1]
    assert [v.field for v in shown] == [v.field for v in many[:len(shown)]]
    assert bad.field_violations[-1].description == f"and {5000 - len(shown)} more violations, not shown"
    status = to_status(InvalidRequest(many))
    assert status is not None and len(base64.b64encode(status.SerializeToString())) < 7000


def test_a_few_violations_are_all_shown() -> None:
    few = [FieldViolation("name", "required"), FieldViolation("files", "a secret holds at least one file")]
    assert [(v.field, v.description) for v in bad_request(few).field_violations] == [
        ("name", "required"), ("files", "a secret holds at least one file")]
