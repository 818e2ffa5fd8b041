"""Refusals said in the words the user typed (issue 36, item 5): a batch file's keys, lines and units; a
command's options; a sentence for a server that cannot be reached. The violations are the server's own:
services.frontend.validate.check_bunch runs on what the file became, as the frontend runs it."""

from __future__ import annotations

import grpc
import pytest

from corral import errors
from corral.batch_file import parse_batch_file
from corral.batch_file_words import FileSource, file_refusal
from corral.cli_admin import BILLING_OPTIONS, USERS_OPTIONS
from corral.errors import FieldViolation as ClientViolation
from corral.refusal_words import USD, Option, in_unit, option_refusal, unreachable_words
from services.frontend.limits import Limits
from services.frontend.validate import UpdateBlock, check_bunch

SMALL = """\
billing_project: p
defaults:
  image: busybox
jobs:
  - name: small
    cores: 100
    command: [echo, hi]
  - name: long
    resources: {cores_mcpu: 100000}
    command: [echo, hi]
"""


def refusal_of(text: str, filename: str = "batch.yaml") -> tuple[errors.InvalidArgument, FileSource]:
    """The server's refusal of the batch `text` describes (what SubmitBatch's check finds), and its source."""
    builder = parse_batch_file(text, filename)
    specs = builder.specs()
    violations = check_bunch(specs, 1, UpdateBlock(1, len(specs), 1, 0), "jobs", Limits())
    assert violations, "the server accepts this batch"
    error = errors.InvalidArgument("invalid request", None,
                                   tuple(ClientViolation(v.field, v.description) for v in violations))
    assert isinstance(builder.source, FileSource)
    return error, builder.source


def test_cores_are_said_as_the_file_wrote_them_where_it_wrote_them() -> None:
    error, source = refusal_of(SMALL)
    # What the user saw before: the API's path and millicores.
    assert "jobs[0].resources.cores_mcpu: must be between 0 and 64000" in str(error)
    assert file_refusal(source, error) == (
        "batch.yaml:6:12: jobs[0] (name: small): cores: must be between 0 and 64; "
        "batch.yaml:9:29: jobs[1] (name: long): resources.cores_mcpu: must be between 0 and 64000 (max_cores_mcpu)")


def test_a_key_from_defaults_is_placed_in_the_defaults() -> None:
    error, source = refusal_of("billing_project: p\ndefaults:\n  image: busybox\n  cores: 65\n"
                               "jobs:\n  - command: [echo]\n")
    assert file_refusal(source, error) == "batch.yaml:4:10: jobs[0]: cores (from defaults): must be between 0 and 64"


def test_a_missing_field_is_placed_at_its_job() -> None:
    error, source = refusal_of("billing_project: p\njobs:\n  - name: a\n    command: [echo]\n")
    assert file_refusal(source, error) == "batch.yaml:3:5: jobs[0] (name: a): image: an image is required"


def test_a_bunch_of_a_large_submission_counts_from_its_first_job() -> None:
    _, source = refusal_of(SMALL)
    error = errors.InvalidArgument("invalid request", None,
                                   (ClientViolation("jobs[0].resources.cores_mcpu", "must be between 0 and 64000"),))
    error.offsets["jobs"] = 1  # the bunch began at the file's second job
    assert file_refusal(source, error) == (
        "batch.yaml:9:29: jobs[1] (name: long): resources.cores_mcpu: must be between 0 and 64000")


def test_a_message_naming_its_field_is_placed_too() -> None:
    _, source = refusal_of(SMALL)
    error = errors.PermissionDenied("jobs[1].image: localhost/other/x is billing project other's")
    assert file_refusal(source, error) == (
        "batch.yaml:3:10: jobs[1] (name: long): image (from defaults): localhost/other/x is billing project other's")


def test_the_billing_limit_is_said_in_usd_as_its_argument() -> None:
    refused = errors.InvalidArgument("invalid request", None, (
        ClientViolation("limit_micro_usd", "must be between 0 and 1000000000000000 (1e9 USD)"),))
    assert option_refusal(refused, BILLING_OPTIONS) == "the limit (USD): must be between 0 and 1,000,000,000 (1e9 USD)"
    assert "limit_micro_usd" in str(refused)  # the error keeps the server's words for API users


def test_a_switch_is_named_as_the_option() -> None:
    taken = errors.CorralError("billing project p has a secret db (replace: true replaces it)",
                               grpc.StatusCode.ALREADY_EXISTS)
    assert option_refusal(taken, {"replace": Option("--replace", flag=True)}) == (
        "billing project p has a secret db (--replace replaces it)")


def test_a_token_that_lasts_zero_days_is_refused_naming_the_option() -> None:
    refused = errors.InvalidArgument("invalid request", None,
                                     (ClientViolation("ttl", "must be positive and at most a year"),))
    assert option_refusal(refused, USERS_OPTIONS) == "--ttl-days: must be positive and at most a year"


def test_a_refusal_of_no_option_stays_the_servers() -> None:
    refused = errors.InvalidArgument("invalid request", None, (ClientViolation("page_token", "not a token"),))
    assert option_refusal(refused, BILLING_OPTIONS) is None


@pytest.mark.parametrize(("text", "said"), [
    ("must be between 0 and 64000 (max_cores_mcpu)", "must be between 0 and 64"),
    ("at most 1,500 and not 2.5 or 1e9", "at most 1.5 and not 2.5 or 1e9"),
    ("jobs[3] is over 250", "jobs[3] is over 0.25"),
])
def test_numbers_in_the_servers_unit(text: str, said: str) -> None:
    from corral.refusal_words import CORES
    assert in_unit(text, CORES) == said
    assert in_unit("between 0 and 5000000", USD) == "between 0 and 5"


@pytest.mark.parametrize(("code", "details", "said"), [
    (grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:8443: "
     "Failed to connect to remote host: Connection refused",
     "cannot reach corral at localhost:8443: connection refused; is corral up running?"),
    (grpc.StatusCode.UNAVAILABLE, "errors resolving nowhere.invalid:8443: [field:hostname lookup error:address "
     "lookup failed for nowhere.invalid:8443: Domain name not found]",
     "cannot reach corral at localhost:8443: no such host (DNS lookup failed); is corral up running?"),
    (grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:8443: "
     "Tls handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:1000007d:SSL "
     "routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED: self signed certificate: OK",
     "cannot reach corral at localhost:8443: its TLS certificate is not trusted (check the profile's CA "
     "certificate, --ca-cert)"),
    (grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:8443: "
     "Tls handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:100000f7:SSL "
     "routines:OPENSSL_internal:WRONG_VERSION_NUMBER: Invalid certificate verification context: OK",
     "cannot reach corral at localhost:8443: the TLS handshake failed (is it corral's TLS port, and the profile's "
     "CA certificate its CA?)"),
    (grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded",
     "cannot reach corral at localhost:8443: no answer in time (deadline exceeded); is corral up running?"),
    # The server's own words, even where they tell of a connection of its own.
    (grpc.StatusCode.UNAVAILABLE, "the token cannot be verified now (the auth service: UNAVAILABLE)", None),
    (grpc.StatusCode.UNAVAILABLE, "the database cannot be reached: connection refused", None),
])
def test_a_server_that_cannot_be_reached_is_a_sentence(code: grpc.StatusCode, details: str, said: str | None) -> None:
    assert unreachable_words("localhost:8443", code, details) == said
