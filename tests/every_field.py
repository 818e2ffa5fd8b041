"""A batch file that sets every field of JobSpec and JobGroupSpec, generated from their descriptors.

A field gets the value `VALUES` names for it (where the frontend constrains
it) or one made for its type, so a field added to the protos is in the file
without a change here. The members of a oneof are spread over the jobs (one
job says argv and resources, the next script and machine_type), a third job
uses the file's shorthands, and parents and groups are referred to by name.
`expected_specs` is what the file must read as, computed without the parser.
"""

from __future__ import annotations

from typing import Any

import yaml
from google.protobuf import descriptor, duration_pb2, json_format

from corral.batch.v1 import job_group_pb2, job_spec_pb2
from corral.batch_file_fields import FLOAT_TYPES, INT_RANGES, enum_names

F = descriptor.FieldDescriptor
GIB = 1024**3
B = "corral.batch.v1."
VALUES: dict[str, Any] = {
    f"{B}JobSpec.image": "busybox",
    f"{B}JobSpec.regions": ["local"],
    f"{B}JobSpec.env": {"MODE": "fast", "LANG": "C.UTF-8"},
    f"{B}JobSpec.machine_type": "n2-standard-8",
    f"{B}JobSpec.timeout": "3600.5s",
    f"{B}JobSpec.max_attempts": 5,
    f"{B}JobSpec.priority": -3,
    f"{B}JobSpec.network_mode": "none",
    f"{B}JobSpec.provisioning_model": "on_demand",
    f"{B}Argv.args": ["sh", "-c", "echo every field"],
    f"{B}ResourceRequest.cores_mcpu": 1500,
    f"{B}ResourceRequest.memory_bytes": 2 * GIB,
    f"{B}ResourceRequest.storage_bytes": GIB,
    f"{B}InputFile.from_url": "{root}/in/ref.fa",
    f"{B}InputFile.to_path": "/data/ref.fa",
    f"{B}OutputFile.from_path": "/data/out",
    f"{B}OutputFile.to_url": "{root}/out/result",
    f"{B}SecretMount.name": "bucket-key",
    f"{B}SecretMount.mount_path": "/secrets/bucket",
    f"{B}JobSpec.image_pull_secret": "registry-login",
    f"{B}JobLock.level": "dataset",
    f"{B}JobLock.mode": "exclusive",
    f"{B}JobLock.names": ["ref", "hg38"],
    f"{B}RetryPolicy.max_preemptions_before_on_demand": 2,
    f"{B}RetryPolicy.retry_oom_with_memory_factor": 2.5,
    f"{B}RetryPolicy.max_memory_bytes": 4 * GIB,
    f"{B}RetryPolicy.max_failed_retries": 3,
    f"{B}RetryPolicy.retry_exit_codes": [75, 99],
    f"{B}RetryPolicy.retry_delay": "1.5s",
    f"{B}RetryPolicy.max_retry_delay": "60s",
}
NAMED_BY_THE_FILE = ("parents", "job_group")
"""JobSpec fields the file writes by name (`parents`, `job_group`); JobGroupSpec's `parent` likewise."""


def value_for(field: F, oneof_choice: int, root: str) -> Any:
    """A value of `field` (the whole list or map, for repeated fields), as the file writes it."""
    if field.full_name in VALUES:
        chosen = VALUES[field.full_name]
        return chosen.replace("{root}", root) if isinstance(chosen, str) else chosen
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        return {"k1": one_value(field.message_type.fields_by_name["value"], oneof_choice, root)}
    if field.is_repeated:
        return [one_value(field, oneof_choice, root)]
    return one_value(field, oneof_choice, root)


def one_value(field: F, oneof_choice: int, root: str) -> Any:
    if field.message_type is not None:
        if field.message_type.full_name == duration_pb2.Duration.DESCRIPTOR.full_name:
            return "2.25s"
        return message_dict(field.message_type, oneof_choice, root)
    if field.enum_type is not None:
        return [written for written in enum_names(field.enum_type) if written.islower()][-1]
    if field.type in INT_RANGES:
        return 7
    if field.type in FLOAT_TYPES:
        return 1.5
    if field.type == F.TYPE_BOOL:
        return True
    return f"{field.name}-value"


def message_dict(message: descriptor.Descriptor, oneof_choice: int, root: str,
                 leave_out: tuple[str, ...] = ()) -> dict[str, Any]:
    """Every field of `message` but `leave_out`; of each oneof, the member at `oneof_choice` (cycling)."""
    fields: dict[str, Any] = {}
    for field in message.fields:
        oneof = field.containing_oneof
        if field.name in leave_out:
            continue
        if oneof is not None and len(oneof.fields) > 1 and \
                oneof.fields[oneof_choice % len(oneof.fields)].name != field.name:
            continue
        fields[field.name] = value_for(field, oneof_choice, root)
    return fields


def every_field_file(root: str, runnable: bool = False) -> dict[str, Any]:
    """The batch file, as the dict yaml.safe_dump writes out; `root` is a storage root the files are under.
    `runnable`: without `machine_type`, which no deployment accepts yet (services.policy.runnable), so that
    a frontend takes the file."""
    group = message_dict(job_group_pb2.JobGroupSpec.DESCRIPTOR, 0, root, leave_out=("parent",))
    spec = job_spec_pb2.JobSpec.DESCRIPTOR
    n_choices = max(len(o.fields) for o in spec.oneofs)
    jobs = [{"name": f"job-{i}", **message_dict(spec, i, root, leave_out=NAMED_BY_THE_FILE)}
            for i in range(n_choices)]
    jobs[0]["job_group"] = "outer"
    jobs[1].update(job_group="inner", parents=["job-0"], accept=["succeeded", "failed"])
    if runnable:
        for job in jobs:
            job.pop("machine_type", None)
    jobs.append({"name": "shorthands", "image": "busybox", "command": ["echo", "short"], "cores": 0.25,
                 "memory_bytes": GIB, "storage_bytes": GIB // 2, "timeout_s": 90.5, "always_run": True,
                 "parents": ["job-0", {"job": "job-1", "accept": ["error", "cancelled"]}]})
    return {
        "billing_project": "proj",
        "attributes": {"name": "every-field"},
        "cancel_after_n_failures": 4,
        "idempotency_token": "every-field-token",
        "job_groups": [{"name": "outer", **group}, {"name": "inner", "parent": "outer", **group}],
        "jobs": jobs,
    }


def every_field_yaml(root: str, runnable: bool = False) -> str:
    return yaml.safe_dump(every_field_file(root, runnable), sort_keys=False)


def proto_json(fields: dict[str, Any], message: descriptor.Descriptor) -> dict[str, Any]:
    """`fields` as ParseDict takes them: enum values written short ("none") by their proto name."""
    converted = {}
    for key, value in fields.items():
        field = message.fields_by_name[key]
        if field.enum_type is not None:
            prefix = field.enum_type.values[0].name.removesuffix("UNSPECIFIED")
            value = [prefix + v.upper() for v in value] if field.is_repeated else prefix + value.upper()
        elif field.message_type is not None and not field.message_type.GetOptions().map_entry \
                and isinstance(value, (dict, list)):
            value = ([proto_json(v, field.message_type) for v in value] if field.is_repeated
                     else proto_json(value, field.message_type))
        converted[key] = value
    return converted


def expected_specs(root: str, runnable: bool = False
                   ) -> tuple[list[job_group_pb2.JobGroupSpec], list[job_spec_pb2.JobSpec]]:
    """The groups and jobs the file must read as: relative references, as a BatchBuilder makes them."""
    document = every_field_file(root, runnable)
    groups = []
    for i, group in enumerate(document["job_groups"]):
        fields = {k: v for k, v in group.items() if k not in ("name", "parent")}
        spec = json_format.ParseDict(proto_json(fields, job_group_pb2.JobGroupSpec.DESCRIPTOR),
                                     job_group_pb2.JobGroupSpec())
        if "parent" in group:
            spec.parent.in_update_index = i - 1
        groups.append(spec)
    jobs = []
    for i, job in enumerate(document["jobs"][:-1]):
        fields = {k: v for k, v in job.items() if k not in ("name", "job_group", "parents", "accept")}
        spec = json_format.ParseDict(proto_json(fields, job_spec_pb2.JobSpec.DESCRIPTOR), job_spec_pb2.JobSpec())
        spec.attributes.setdefault("name", job["name"])  # a job's name is stored as its attribute `name`
        jobs.append(spec)
    jobs[0].job_group.in_update_index = 0
    jobs[1].job_group.in_update_index = 1
    jobs[1].parents.add(in_update_offset=-1, accepted_states=["JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"])
    short = job_spec_pb2.JobSpec(image="busybox", always_run=True, resources=job_spec_pb2.ResourceRequest(
        cores_mcpu=250, memory_bytes=GIB, storage_bytes=GIB // 2))
    short.argv.args.extend(["echo", "short"])
    short.attributes["name"] = "shorthands"
    short.timeout.FromNanoseconds(90_500_000_000)
    last = len(jobs)
    short.parents.add(in_update_offset=-last, accepted_states=["JOB_STATE_SUCCEEDED"])
    short.parents.add(in_update_offset=1 - last, accepted_states=["JOB_STATE_ERROR", "JOB_STATE_CANCELLED"])
    jobs.append(short)
    return groups, jobs


def fields_set(messages: list[Any]) -> set[str]:
    """Full names of every field set in any of `messages`, nested messages included."""
    found: set[str] = set()
    for message in messages:
        for field, value in message.ListFields():
            found.add(field.full_name)
            if field.message_type is not None and not field.message_type.GetOptions().map_entry:
                found |= fields_set(list(value) if field.is_repeated else [value])
    return found


def all_fields(message: descriptor.Descriptor, seen: set[str] | None = None) -> set[str]:
    """Full names of every field of `message` and of the messages it holds (maps' entries left out)."""
    seen = set() if seen is None else seen
    for field in message.fields:
        seen.add(field.full_name)
        inner = field.message_type
        if inner is not None and not inner.GetOptions().map_entry and inner.full_name.startswith(B) and \
                not any(f.startswith(inner.full_name + ".") for f in seen):
            all_fields(inner, seen)
    return seen
