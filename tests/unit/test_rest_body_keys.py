"""The tables the REST body-key check (services/gateway/rest_body_keys.py) is generated with: every public
REST route with a body is covered, its path pattern matches its paths (and not its neighbours'), and every
message a body may hold lists its fields by both names. The check itself runs in the real Envoy:
tests/service/test_gateway_public.py."""

from __future__ import annotations

import re

from google.api import annotations_pb2

from services.gateway.descriptors import package_descriptor_set
from services.gateway.rest_body_keys import body_routes, field_table, lua_source

FILES = package_descriptor_set()


def lua_match(pattern: str, path: str) -> bool:
    """A Lua pattern of _path_pattern's making (%-escapes, [^/:]+) read as a regular expression."""
    return re.fullmatch(re.sub(r"%(.)", lambda m: re.escape(m[1]), pattern).strip("^$"), path) is not None


def test_every_rest_route_with_a_body_is_checked() -> None:
    with_body = {(m.name, getattr(m.options.Extensions[annotations_pb2.http],
                                  m.options.Extensions[annotations_pb2.http].WhichOneof("pattern")))
                 for f in FILES.file for s in f.service for m in s.method
                 if m.options.HasExtension(annotations_pb2.http) and m.options.Extensions[annotations_pb2.http].body}
    assert len(body_routes(FILES)) == len(with_body) > 20


def test_path_patterns_match_their_paths_only() -> None:
    routes = {r.want: r for r in body_routes(FILES)}
    cancel = routes["M:corral.batch.v1.CancelBatchRequest"].pattern
    submit = routes["M:corral.batch.v1.SubmitBatchRequest"].pattern
    assert lua_match(cancel, "/api/v1/batches/7:cancel") and not lua_match(cancel, "/api/v1/batches/7:rerunFailed")
    assert lua_match(submit, "/api/v1/batches:submit") and not lua_match(submit, "/api/v1/batches/7:submit")
    limit = routes["M:corral.billing.v1.SetLimitRequest"]
    assert limit.verb == "PUT" and lua_match(limit.pattern, "/api/v1/billing-projects/lab/limit")


def test_bodies_know_their_fields_by_both_names_and_maps_keep_any_key() -> None:
    table = field_table(FILES, ["corral.batch.v1.SubmitBatchRequest"])
    job = table["corral.batch.v1.JobSpec"]
    assert job.keys["imagePullSecret"] is None and job.keys["image_pull_secret"] is None
    assert job.keys["resources"] == "M:corral.batch.v1.ResourceRequest"
    assert job.keys["env"] is None  # a map of strings: its keys are the caller's
    assert job.keys["timeout"] is None  # google.protobuf.Duration: a leaf
    assert "imagePullSecret" in job.json_names and "image_pull_secret" not in job.json_names
    assert table["corral.batch.v1.SubmitBatchRequest"].keys["jobs"] == "A:corral.batch.v1.JobSpec"
    assert "envoy_on_request" in lua_source(FILES)
