"""services/common/fields.py: walking a request against a table of limits,
and the frontend's and auth's tables covering every field of their requests.
That each limit fits its column is checked in tests/db/test_field_limits_schema.py,
and each limit over real gRPC in tests/service/test_field_limits.py."""

from __future__ import annotations

import pytest
from google.protobuf import descriptor

from corral.auth.v1 import auth_service_pb2
from corral.batch.v1 import batch_service_pb2 as bpb
from corral.batch.v1 import (fleet_service_pb2, image_service_pb2, job_group_service_pb2, job_service_pb2,
                              job_spec_pb2, lock_service_pb2, secret_service_pb2)
from corral.billing.v1 import billing_service_pb2
from services.auth.field_limits import AUTH_FIELD_LIMITS
from services.common.fields import (
    FieldLimits,
    FieldViolation,
    Integer,
    Map,
    Repeated,
    Text,
    Unchecked,
    leaf_fields,
    violations,
)
from services.frontend.field_limits import request_field_limits
from services.frontend.limits import Limits
from services.frontend.query import QueryTooLarge, parse

B = "corral.batch.v1."
TABLE: FieldLimits = {
    f"{B}SubmitBatchRequest.billing_project": Text(5, column="batches.billing_project"),
    f"{B}SubmitBatchRequest.attributes": Map(2, Text(3), Text(max_bytes=4)),
    f"{B}SubmitBatchRequest.cancel_after_n_failures": Integer(1, 9),
    f"{B}SubmitBatchRequest.jobs": Repeated(3, setting="max_jobs_per_bunch"),
    f"{B}JobSpec.regions": Repeated(2, Text(4)),
    f"{B}JobSpec.priority": Integer(-1, 1, by_servicer=True),
    f"{B}JobSpec.image": Unchecked("spec"),
    f"{B}JobSpec.locks": Repeated(5),
    f"{B}JobLock.names": Repeated(5, Text(2)),
    f"{B}ParentRef.job_id": Integer(1, 10),
}


def spec(**fields: object) -> job_spec_pb2.JobSpec:
    return job_spec_pb2.JobSpec(image="x" * 1000, **fields)  # type: ignore[arg-type]


def test_a_request_within_its_limits_has_no_violations() -> None:
    request = bpb.SubmitBatchRequest(billing_project="proj", attributes={"abc": "éé"}, cancel_after_n_failures=9,
                                     jobs=[spec(regions=["us", "eu"], parents=[job_spec_pb2.ParentRef(job_id=10)])])
    assert violations(request, TABLE) == []


def test_violations_name_the_field_by_its_path() -> None:
    request = bpb.SubmitBatchRequest(
        billing_project="toolong", attributes={"abcd": "v", "k": "ééé"}, cancel_after_n_failures=0,
        jobs=[spec(), spec(regions=["x", "bigger"], locks=[job_spec_pb2.JobLock(names=["ok", "nope"])],
                           parents=[job_spec_pb2.ParentRef(in_update_offset=-1), job_spec_pb2.ParentRef(job_id=11)])])
    assert violations(request, TABLE) == [
        FieldViolation("billing_project", "at most 5 characters"),
        FieldViolation("attributes", "key 'abcd': at most 3 characters"),
        FieldViolation("attributes", "value of 'k': at most 4 bytes of UTF-8"),
        FieldViolation("cancel_after_n_failures", "must be between 1 and 9"),
        FieldViolation("jobs[1].regions[1]", "at most 4 characters"),
        FieldViolation("jobs[1].locks[0].names[1]", "at most 2 characters"),
        FieldViolation("jobs[1].parents[1].job_id", "must be between 1 and 10"),
    ]


def test_list_and_map_sizes_name_their_setting_and_stop_the_walk() -> None:
    request = bpb.SubmitBatchRequest(attributes={"a": "", "b": "", "c": ""}, jobs=[spec(regions=["toolong"])] * 4)
    assert violations(request, TABLE) == [
        FieldViolation("attributes", "at most 2 entries"),
        FieldViolation("jobs", "at most 3 entries (max_jobs_per_bunch)"),
    ]


def test_an_unset_field_is_not_checked_but_a_present_one_is() -> None:
    # cancel_after_n_failures is `optional`: 0 set explicitly is below its minimum; a plain
    # proto3 scalar at its default (job_id 0 of a ParentRef naming an offset) is not given.
    assert violations(bpb.SubmitBatchRequest(), TABLE) == []
    assert [v.field for v in violations(bpb.SubmitBatchRequest(cancel_after_n_failures=0), TABLE)] == [
        "cancel_after_n_failures"]
    assert violations(bpb.SubmitBatchRequest(jobs=[spec(parents=[job_spec_pb2.ParentRef(in_update_offset=-1)])]),
                      TABLE) == []


def test_limits_the_servicer_checks_and_unchecked_fields_are_left_alone() -> None:
    assert violations(bpb.SubmitBatchRequest(jobs=[spec(priority=5)]), TABLE) == []


def test_the_number_of_violations_is_capped() -> None:
    request = bpb.SubmitBatchRequest(jobs=[spec(regions=["toolong", "toolong"])] * 3)
    assert len(violations(request, TABLE)) == 6
    assert len(violations(request, TABLE, limit=4)) == 4


def test_a_setting_is_named_in_the_description() -> None:
    assert Text(max_bytes=3, setting="max_query_bytes").check("abcd") == "at most 3 bytes of UTF-8 (max_query_bytes)"
    assert Integer(0, 5, setting="max_cores_mcpu").check(6) == "must be between 0 and 5 (max_cores_mcpu)"


def _services() -> list[descriptor.ServiceDescriptor]:
    return [bpb.DESCRIPTOR.services_by_name["BatchService"],
            job_service_pb2.DESCRIPTOR.services_by_name["JobService"],
            job_group_service_pb2.DESCRIPTOR.services_by_name["JobGroupService"],
            fleet_service_pb2.DESCRIPTOR.services_by_name["FleetService"],
            lock_service_pb2.DESCRIPTOR.services_by_name["LockService"],
            secret_service_pb2.DESCRIPTOR.services_by_name["SecretService"],
            image_service_pb2.DESCRIPTOR.services_by_name["ImageService"],
            billing_service_pb2.DESCRIPTOR.services_by_name["BillingService"]]


def needs_a_limit(field: descriptor.FieldDescriptor) -> bool:
    """Strings, numbers, lists and maps, and durations: what a user can make too big."""
    if field.is_repeated:
        return True
    if field.message_type is not None:
        return field.message_type.full_name in ("google.protobuf.Duration", "google.protobuf.Timestamp")
    return field.type not in (descriptor.FieldDescriptor.TYPE_BOOL, descriptor.FieldDescriptor.TYPE_ENUM)


def fields_without_limits(services: list[descriptor.ServiceDescriptor], table: FieldLimits) -> list[str]:
    return sorted({f.full_name for service in services for method in service.methods
                   for f in leaf_fields(method.input_type) if needs_a_limit(f) and f.full_name not in table})


def test_every_field_of_the_frontends_requests_has_a_limit() -> None:
    assert fields_without_limits(_services(), request_field_limits(Limits())) == []


def test_every_field_of_auths_requests_has_a_limit() -> None:
    assert fields_without_limits([auth_service_pb2.DESCRIPTOR.services_by_name["AuthService"]],
                                 AUTH_FIELD_LIMITS) == []


def test_the_tables_name_only_fields_that_exist() -> None:
    from google.protobuf import descriptor_pool

    pool = descriptor_pool.Default()
    for name in [*request_field_limits(Limits()), *AUTH_FIELD_LIMITS]:
        assert pool.FindFieldByName(name) is not None


def test_lists_and_maps_have_list_limits() -> None:
    from google.protobuf import descriptor_pool

    pool = descriptor_pool.Default()
    for table in (request_field_limits(Limits()), AUTH_FIELD_LIMITS):
        for name, limit in table.items():
            field = pool.FindFieldByName(name)
            is_map = field.message_type is not None and field.message_type.GetOptions().map_entry
            if is_map:
                assert isinstance(limit, (Map, Unchecked)), name
            elif field.is_repeated:
                assert isinstance(limit, (Repeated, Unchecked)), name
            else:
                assert not isinstance(limit, (Repeated, Map)), name


def test_settings_flow_into_the_table() -> None:
    table = request_field_limits(Limits(max_query_bytes=10, max_jobs_per_bunch=2, max_attributes=1))
    request = bpb.SubmitBatchRequest(attributes={"a": "", "b": ""}, jobs=[spec(attributes={"a": "", "b": ""})] * 3)
    assert violations(request, table) == [FieldViolation("attributes", "at most 1 entries (max_attributes)"),
                                          FieldViolation("jobs", "at most 2 entries (max_jobs_per_bunch)")]
    # A query's length is the parser's to refuse, saying where (as every query refusal does):
    # the interceptor leaves it alone.
    assert violations(bpb.ListBatchesRequest(query="x" * 11), table) == []
    with pytest.raises(QueryTooLarge, match="max_query_bytes") as error:
        parse("x" * 11, "batches", max_bytes=10)
    assert error.value.description.startswith("at character 10: ")


def test_keys_a_pad_space_collation_would_confuse_are_refused() -> None:
    table = {f"{B}SubmitBatchRequest.attributes": Map(5, Text(10), Text(10), pad_space_keys=True)}
    assert violations(bpb.SubmitBatchRequest(attributes={"a": "", " a": "", "a\t": ""}), table) == []
    assert violations(bpb.SubmitBatchRequest(attributes={"a": "", "a  ": ""}), table) == [
        FieldViolation("attributes", "two keys differ only in trailing spaces, which the database ignores")]
