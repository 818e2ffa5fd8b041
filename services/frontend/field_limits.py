"""The limit of every field a user controls in the frontend's requests.

A string or number that lands in a column is held to the column's size (a
VARCHAR(100) takes 100 characters, a TEXT 65,535 bytes, an INT 2³¹−1),
and names the column so `tests/db/test_field_limits_schema.py` can compare
the two; a list or map is held to its `Limits` setting. Fields kept only in
a job's spec blob are left `Unchecked`: the spec's whole size is limited
(`max_spec_bytes`). `tests/service/test_field_limits.py` checks that every
field of every request has an entry here and sends each at its limit and
one past it. The frontend's request interceptor applies the table before
any servicer runs (services.common.call_limits).
"""

from __future__ import annotations

from services.common.fields import (
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    TEXT_BYTES,
    FieldLimits,
    Integer,
    Limit,
    Map,
    Repeated,
    Text,
    Unchecked,
)
from services.frontend.billing_store import MAX_MICRO_USD
from services.frontend.limits import Limits
from services.frontend.quota_store import MAX_CAP, MAX_WEIGHT
from services.frontend.watch import MAX_EVENTS_PER_MESSAGE

BATCH = "corral.batch.v1."
BILLING = "corral.billing.v1."
IDEMPOTENCY_TOKEN_CHARS = 100
"""batches.idempotency_token and batch_updates.idempotency_token are VARCHAR(100)."""
# What the servicers append to a client's token for the updates they create.
FIRST_UPDATE_SUFFIX = "/first"
SUBMIT_SUFFIX = "/submit"
RERUN_PREFIX = "rerun/"
PAGE_TOKEN_CHARS = 256
"""Longer than any token the services return (base64 of an id, day or name)."""
LOCK_PAGE_TOKEN_CHARS = 4096
"""ListLocks' token holds a project, level and name (100 + 64 + 255 characters, at most 6 bytes each as JSON)
in base64: at most 3,376 characters."""
ENUM_LIST_ITEMS = 16
"""A list of enum values: more entries than the enum has values is refused."""

_SPEC_ONLY = Unchecked("kept only in the job's spec blob, whose size max_spec_bytes limits")
_UNUSED = Unchecked("not stored: the server does not use it")
_RETRY_POLICY = Unchecked("bounded with the spec (validate.retry_policy_violations; docs/security.md)")


def _token(chars: int) -> Text:
    return Text(chars, column="batch_updates.idempotency_token")


def _attributes(limits: Limits, table: str) -> Map:
    return Map(limits.max_attributes, Text(100, column=f"{table}.key"),
               Text(max_bytes=TEXT_BYTES, column=f"{table}.value"), setting="max_attributes", pad_space_keys=True)


def _query(limits: Limits) -> Text:
    # The parser refuses a longer query itself (at once, without reading it), and says
    # where: "at character 4080: the query is longer than ...", as every query refusal does.
    return Text(max_bytes=limits.max_query_bytes, setting="max_query_bytes", by_servicer=True)


def _int_column(column: str, least: int = INT32_MIN) -> Integer:
    return Integer(least, INT32_MAX, column=column)


def request_field_limits(limits: Limits) -> FieldLimits:
    """Limits by field for BatchService, JobService, JobGroupService, FleetService, LockService, SecretService,
    ImageService and BillingService."""
    batch_id = Integer(INT64_MIN, INT64_MAX, column="batches.batch_id")
    page_size = Integer(0, INT32_MAX, by_servicer=True)  # a negative one is refused; a larger one is the cap
    page_token = Text(PAGE_TOKEN_CHARS)
    project = Text(100, column="billing_projects.name")
    username = Text(64, column="billing_project_members.user")  # the auth service's username rule
    table: dict[str, Limit] = {}
    for request in ("GetBatch", "ListBatches", "CancelBatch", "DeleteBatch", "WatchBatch", "CreateUpdate",
                    "CreateJobGroups", "AddJobs", "CommitUpdate", "RerunFailedJobs", "GetJob", "ListJobs",
                    "GetJobAttempts", "GetJobLog", "StreamJobLog", "GetAttemptUsage", "ExplainJob", "GetJobGroup",
                    "ListJobGroups", "CancelJobGroup", "HoldJobs", "ReleaseJobs"):
        if request != "ListBatches":
            table[f"{BATCH}{request}Request.batch_id"] = batch_id
    for request in ("GetJob", "GetJobAttempts", "GetJobLog", "StreamJobLog", "GetAttemptUsage", "ExplainJob"):
        table[f"{BATCH}{request}Request.job_id"] = _int_column("jobs.job_id")
    for request in ("CreateJobGroups", "AddJobs", "CommitUpdate"):
        table[f"{BATCH}{request}Request.update_id"] = _int_column("batch_updates.update_id")
    for request in ("ListBatches", "ListJobs", "ListJobGroups", "ListInstances"):
        table[f"{BATCH}{request}Request.page_size"] = page_size
        table[f"{BATCH}{request}Request.page_token"] = page_token
    for request in ("ListBatches", "WatchBatch", "ListJobs"):
        table[f"{BATCH}{request}Request.query"] = _query(limits)
    for request, suffix in (("CreateBatch", FIRST_UPDATE_SUFFIX), ("SubmitBatch", SUBMIT_SUFFIX)):
        table.update({
            f"{BATCH}{request}Request.billing_project": Text(100, column="batches.billing_project"),
            f"{BATCH}{request}Request.attributes": _attributes(limits, "batch_attributes"),
            f"{BATCH}{request}Request.callback_url": Text(2048, column="batches.callback_url"),
            f"{BATCH}{request}Request.cancel_after_n_failures": _int_column("job_groups.cancel_after_n_failures", 1),
            f"{BATCH}{request}Request.idempotency_token": _token(IDEMPOTENCY_TOKEN_CHARS - len(suffix)),
        })
    for request in ("CreateBatch", "CreateUpdate"):
        table[f"{BATCH}{request}Request.n_jobs"] = _int_column("batch_updates.n_jobs", 0)
        table[f"{BATCH}{request}Request.n_job_groups"] = _int_column("batch_updates.n_job_groups", 0)
    for request in ("CreateJobGroups", "SubmitBatch", "EstimateBatch"):
        table[f"{BATCH}{request}Request.job_groups"] = Repeated(limits.max_job_groups_per_bunch,
                                                                setting="max_job_groups_per_bunch")
    for request in ("AddJobs", "SubmitBatch", "EstimateBatch"):
        table[f"{BATCH}{request}Request.jobs"] = Repeated(limits.max_jobs_per_bunch, setting="max_jobs_per_bunch")
    for request in ("CancelBatch", "CancelJobGroup"):
        table[f"{BATCH}{request}Request.reason"] = Text(1024, column="job_groups_cancelled.reason")
    for request in ("GetJobLog", "StreamJobLog"):
        table[f"{BATCH}{request}Request.attempt_id"] = Text(40, column="attempts.attempt_id")
        table[f"{BATCH}{request}Request.start_byte"] = Unchecked("any offset (negative: from the end); not stored")
    table[f"{BATCH}GetAttemptUsageRequest.attempt_id"] = Text(40, column="attempts.attempt_id")
    table.update({
        # BatchService
        f"{BATCH}WatchBatchRequest.from_event_id": Integer(0, INT64_MAX, column="batch_events.event_id",
                                                            by_servicer=True),
        f"{BATCH}WatchBatchRequest.max_events_per_message": Integer(0, MAX_EVENTS_PER_MESSAGE, by_servicer=True),
        f"{BATCH}CreateUpdateRequest.idempotency_token": _token(IDEMPOTENCY_TOKEN_CHARS),
        f"{BATCH}CreateJobGroupsRequest.first_index": _int_column("job_groups.job_group_id", 0),
        f"{BATCH}AddJobsRequest.first_index": _int_column("jobs.job_id", 0),
        f"{BATCH}AddJobsRequest.bunch_index": _UNUSED,
        # EstimateBatch reads the project and positions jobs as SubmitBatch and AddJobs would.
        f"{BATCH}EstimateBatchRequest.billing_project": project,
        f"{BATCH}EstimateBatchRequest.first_index": _int_column("jobs.job_id", 0),
        f"{BATCH}EstimateBatchRequest.n_jobs": _int_column("batch_updates.n_jobs", 0),
        f"{BATCH}EstimateBatchRequest.n_job_groups": _int_column("batch_updates.n_job_groups", 0),
        f"{BATCH}RerunFailedJobsRequest.states": Repeated(ENUM_LIST_ITEMS),
        f"{BATCH}RerunFailedJobsRequest.idempotency_token": _token(IDEMPOTENCY_TOKEN_CHARS - len(RERUN_PREFIX)),
        # JobGroupSpec and JobGroupRef
        f"{BATCH}JobGroupSpec.attributes": _attributes(limits, "job_group_attributes"),
        f"{BATCH}JobGroupSpec.cancel_after_n_failures": _int_column("job_groups.cancel_after_n_failures", 1),
        f"{BATCH}JobGroupRef.job_group_id": _int_column("job_groups.job_group_id", 0),
        f"{BATCH}JobGroupRef.in_update_index": Integer(0, INT32_MAX),
        **{f"{BATCH}RetryPolicy.{name}": _RETRY_POLICY for name in (
            "max_preemptions_before_on_demand", "retry_oom_with_memory_factor", "max_memory_bytes",
            "max_failed_retries", "retry_exit_codes", "retry_delay", "max_retry_delay")},
        # JobSpec
        f"{BATCH}JobSpec.image": _SPEC_ONLY,
        f"{BATCH}Argv.args": _SPEC_ONLY,
        f"{BATCH}JobSpec.script": _SPEC_ONLY,
        f"{BATCH}JobSpec.env": Map(limits.max_env_per_job, _SPEC_ONLY, _SPEC_ONLY, setting="max_env_per_job"),
        f"{BATCH}ResourceRequest.cores_mcpu": Integer(0, limits.max_cores_mcpu, column="jobs.cores_mcpu",
                                                      setting="max_cores_mcpu"),
        f"{BATCH}ResourceRequest.memory_bytes": Integer(0, INT64_MAX, column="jobs.memory_bytes"),
        f"{BATCH}ResourceRequest.storage_bytes": Integer(0, INT64_MAX, column="jobs.storage_bytes"),
        f"{BATCH}JobSpec.machine_type": _SPEC_ONLY,
        f"{BATCH}JobSpec.regions": Repeated(limits.max_regions_per_job, Text(64, column="regions.name"),
                                            setting="max_regions_per_job"),
        f"{BATCH}JobSpec.timeout": _SPEC_ONLY,
        f"{BATCH}JobSpec.max_attempts": _int_column("jobs.max_attempts", 0),
        f"{BATCH}JobSpec.input_files": Repeated(limits.max_files_per_job, setting="max_files_per_job"),
        f"{BATCH}InputFile.from_url": _SPEC_ONLY,
        f"{BATCH}InputFile.to_path": _SPEC_ONLY,
        f"{BATCH}JobSpec.output_files": Repeated(limits.max_files_per_job, setting="max_files_per_job"),
        f"{BATCH}OutputFile.from_path": _SPEC_ONLY,
        f"{BATCH}OutputFile.to_url": _SPEC_ONLY,
        f"{BATCH}JobSpec.secrets": Repeated(limits.max_secrets_per_job, setting="max_secrets_per_job"),
        f"{BATCH}SecretMount.name": _SPEC_ONLY,
        f"{BATCH}SecretMount.mount_path": _SPEC_ONLY,
        # PROJECT/NAME at most: the rest of its rule is validate.secret_reference's.
        f"{BATCH}JobSpec.image_pull_secret": Text(2 * 64 + 1),
        f"{BATCH}JobSpec.attributes": _attributes(limits, "job_attributes"),
        f"{BATCH}JobSpec.locks": Repeated(limits.max_locks_per_job, setting="max_locks_per_job"),
        f"{BATCH}JobLock.level": Text(64, column="job_locks.level"),
        f"{BATCH}JobLock.names": Repeated(limits.max_names_per_lock, Text(255, column="job_locks.lock_name"),
                                          setting="max_names_per_lock"),
        f"{BATCH}JobSpec.priority": _int_column("jobs.priority"),
        f"{BATCH}JobSpec.parents": Repeated(limits.max_parents_per_job, setting="max_parents_per_job"),
        f"{BATCH}ParentRef.job_id": _int_column("job_parents.parent_id", 1),
        f"{BATCH}ParentRef.in_update_offset": Integer(INT32_MIN, -1),
        f"{BATCH}ParentRef.accepted_states": Repeated(ENUM_LIST_ITEMS),
        # JobService and JobGroupService
        f"{BATCH}GetJobLogRequest.max_bytes": Integer(0, INT64_MAX, by_servicer=True),  # more than the cap is the cap
        f"{BATCH}GetJobGroupRequest.job_group_id": _int_column("job_groups.job_group_id"),
        f"{BATCH}ListJobGroupsRequest.parent_job_group_id": _int_column("job_groups.parent_id"),
        f"{BATCH}CancelJobGroupRequest.job_group_id": _int_column("job_groups.job_group_id"),
        f"{BATCH}HoldJobsRequest.job_group_id": _int_column("job_groups_held.job_group_id"),
        f"{BATCH}HoldJobsRequest.job_id": _int_column("jobs_held.job_id"),
        f"{BATCH}ReleaseJobsRequest.job_group_id": _int_column("job_groups_held.job_group_id"),
        f"{BATCH}ReleaseJobsRequest.job_id": _int_column("jobs_held.job_id"),
        # FleetService
        f"{BATCH}ListInstancesRequest.pool": Text(100, column="instances.inst_coll"),
        f"{BATCH}PausePoolRequest.pool": Text(100, column="instance_collections.name"),
        f"{BATCH}ResumePoolRequest.pool": Text(100, column="instance_collections.name"),
        # LockService
        f"{BATCH}ListLocksRequest.billing_project": project,
        f"{BATCH}ListLocksRequest.level": Text(64, column="job_locks.level"),
        f"{BATCH}ListLocksRequest.name": Text(255, column="job_locks.lock_name"),
        f"{BATCH}ListLocksRequest.page_size": page_size,
        f"{BATCH}ListLocksRequest.page_token": Text(LOCK_PAGE_TOKEN_CHARS),
        # SecretService
        f"{BATCH}CreateSecretRequest.name": Text(64, column="secrets.name"),
        f"{BATCH}CreateSecretRequest.files": Map(
            limits.max_secret_files, Text(100),  # file names, stored in secrets.file_names (TEXT) with the others
            Text(max_bytes=limits.max_secret_bytes, setting="max_secret_bytes"), setting="max_secret_files"),
        f"{BATCH}DeleteSecretRequest.name": Text(64, column="secrets.name"),
        f"{BATCH}ListSecretsRequest.page_size": page_size,
        f"{BATCH}ListSecretsRequest.page_token": page_token,
        # ImageService (ImportImage's stream is checked message by message by the servicer: images.py)
        f"{BATCH}ImportImageHeader.name": Text(128, by_servicer=True),
        f"{BATCH}ImportImageHeader.tag": Text(128, by_servicer=True),
        # Negative is refused; past max_image_import_bytes the import is RESOURCE_EXHAUSTED before any chunk.
        f"{BATCH}ImportImageHeader.size_bytes": Integer(0, INT64_MAX, by_servicer=True),
        # A chunk is bounded with its whole message, by gRPC (RESOURCE_EXHAUSTED, not a field's INVALID_ARGUMENT).
        f"{BATCH}ImportImageRequest.chunk": Unchecked("its message is at most max_request_bytes, the archive at most "
                                                      "max_image_import_bytes (images.py)"),
        f"{BATCH}DeleteImageRequest.name": Text(128),
        f"{BATCH}DeleteImageRequest.tag": Text(128),
        f"{BATCH}ListImagesRequest.page_size": page_size,
        f"{BATCH}ListImagesRequest.page_token": Text(PAGE_TOKEN_CHARS * 2),  # a repository and tag, in base64
        # BillingService
        f"{BILLING}CreateBillingProjectRequest.name": Text(64, column="billing_projects.name"),
        f"{BILLING}CreateBillingProjectRequest.limit_micro_usd": Integer(0, MAX_MICRO_USD, by_servicer=True),
        f"{BILLING}CreateBillingProjectRequest.members": Repeated(limits.max_members_per_request, username,
                                                                  setting="max_members_per_request"),
        f"{BILLING}SetLimitRequest.limit_micro_usd": Integer(0, MAX_MICRO_USD, by_servicer=True),
        f"{BILLING}SetLimitRequest.max_job_duration": Unchecked("between 1 s and 7 days (billing.py)"),
        f"{BILLING}ListBillingProjectsRequest.member": Text(100, column="billing_project_members.user"),
        f"{BILLING}ListBillingProjectsRequest.page_size": page_size,
        f"{BILLING}ListBillingProjectsRequest.page_token": page_token,
        f"{BILLING}AddMemberRequest.username": username,
        f"{BILLING}RemoveMemberRequest.username": username,
        f"{BILLING}GetSpendRequest.first_day": Text(10),  # YYYY-MM-DD
        f"{BILLING}GetSpendRequest.last_day": Text(10),
        f"{BILLING}GetSpendRequest.page_size": page_size,
        f"{BILLING}GetSpendRequest.page_token": page_token,
        f"{BILLING}WatchSpendRequest.min_interval": Unchecked("clamped to between 1 s and 1 h"),
        f"{BILLING}SetQuotaRequest.name": Text(100, column="quotas.name"),
        f"{BILLING}SetQuotaRequest.max_running_cores_mcpu": Integer(1, MAX_CAP, column="quotas.max_running_cores_mcpu",
                                                                    by_servicer=True),
        f"{BILLING}SetQuotaRequest.max_running_jobs": Integer(1, MAX_CAP, column="quotas.max_running_jobs",
                                                              by_servicer=True),
        f"{BILLING}SetQuotaRequest.max_ready_jobs": Integer(1, MAX_CAP, column="quotas.max_ready_jobs",
                                                            by_servicer=True),
        f"{BILLING}SetQuotaRequest.weight": Integer(0, MAX_WEIGHT, column="quotas.weight", by_servicer=True),
        f"{BILLING}ListQuotasRequest.page_size": page_size,
        f"{BILLING}ListQuotasRequest.page_token": page_token,
    })
    for request in ("GetBillingProject", "AddMember", "RemoveMember", "SetLimit", "CloseBillingProject",
                    "ReopenBillingProject", "DeleteBillingProject", "GetSpend", "WatchSpend"):
        table[f"{BILLING}{request}Request.billing_project"] = project
    for request in ("CreateSecret", "ListSecrets", "DeleteSecret"):
        table[f"{BATCH}{request}Request.billing_project"] = Text(100, column="secrets.billing_project")
    table[f"{BATCH}ImportImageHeader.billing_project"] = Text(100, column="billing_projects.name", by_servicer=True)
    for request in ("ListImages", "DeleteImage"):
        table[f"{BATCH}{request}Request.billing_project"] = project
    return table
