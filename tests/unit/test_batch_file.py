"""Batch files (corral/batch_file.py): every mistake refused with its message and line:column, every
JobSpec and JobGroupSpec field read, defaults merged, the files the CLI tests and README use still read."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.batch.v1 import batch_service_pb2, job_group_pb2, job_spec_pb2
from corral.batch_file import (
    BATCH_FIELDS,
    GROUP_KEYS,
    JOB_KEYS,
    REPLACED_JOB_FIELDS,
    BatchFileError,
    parse_batch_file,
    read_batch_file,
)
from corral.batch_file_fields import SHORTHANDS
from corral.builder import BatchBuilder
from corral.errors import UsageError
from tests.every_field import all_fields, every_field_yaml, expected_specs, fields_set
from tests.service.test_cli import BATCH_YAML

HEAD = "billing_project: p\njobs:\n"
A = "  - {name: a, image: x, command: [t]}\n"

MISTAKES = {
    # The cases: each silently ignored or a traceback before.
    "parent": (HEAD + A + "  - image: x\n    command: [t]\n    parent: [a]\n",
               "6:5: jobs[1]: unknown key 'parent'; did you mean 'parents'?"),
    "always_runn": (HEAD + "  - image: x\n    command: [t]\n    always_runn: true\n",
                    "5:5: jobs[0]: unknown key 'always_runn'; did you mean 'always_run'?"),
    "cpus": (HEAD + "  - image: x\n    command: [t]\n    cpus: 2\n",
             "5:5: jobs[0]: unknown key 'cpus'; did you mean 'cores'?"),
    "duplicate name": (HEAD + A + A, "4:12: jobs[1].name: duplicate job name 'a' (first at 3:12)"),
    "unknown parent": (HEAD + "  - {name: fetch, image: x, command: [t]}\n"
                              "  - {image: x, command: [t], parents: [fetc]}\n",
                       "4:40: jobs[1].parents[0]: no job is named 'fetc'; did you mean 'fetch'?"),
    "cycle": (HEAD + "  - {name: a, image: x, command: [t], parents: [c]}\n  - {name: b, image: x, command: [t], "
                     "parents: [a]}\n  - {name: c, image: x, command: [t], parents: [b]}\n",
              "4:49: jobs[1].parents[0]: dependency cycle: 'a' needs 'c', 'c' needs 'b', 'b' needs 'a'"),
    "own parent": (HEAD + "  - {name: a, image: x, command: [t], parents: [a]}\n",
                   "3:49: jobs[0].parents[0]: dependency cycle: 'a' needs 'a'"),
    "parent after child": (HEAD + "  - {name: a, image: x, command: [t], parents: [b]}\n  - {name: b, image: x, "
                                  "command: [t]}\n",
                           "3:49: jobs[0].parents[0]: 'b' comes later in the file (jobs[1]): list a job after those it "
                           "refers to (ids follow the file)"),
    "parent twice": (HEAD + A + "  - {image: x, command: [t], parents: [a, a]}\n",
                     "4:43: jobs[1].parents[1]: 'a' is listed twice"),
    "cores: lots": (HEAD + "  - image: x\n    command: [t]\n    cores: lots\n",
                    "5:12: jobs[0].cores: \"lots\": not a number; write cores (0.25, 2) or milli-cores with m (250m)"),
    "accept: [done]": (HEAD + A + "  - {image: x, command: [t], parents: [a], accept: [done]}\n",
                       "4:53: jobs[1].accept[0]: unknown value 'done' (expected one of succeeded, failed, error, "
                       "cancelled)"),
    "accept: []": (HEAD + A + "  - {image: x, command: [t], parents: [a], accept: []}\n",
                   "4:52: jobs[1].accept: name at least one state (succeeded, failed, error, cancelled)"),
    "parent's own accept": (HEAD + A + "  - {image: x, command: [t], parents: [{job: a, accept: [ok]}]}\n",
                            "4:58: jobs[1].parents[0].accept[0]: unknown value 'ok' (expected one of succeeded, "
                            "failed, error, cancelled)"),
    "parent without job": (HEAD + A + "  - {image: x, command: [t], parents: [{accept: [failed]}]}\n",
                           "4:40: jobs[1].parents[0]: a parent names its job: {job: NAME, accept: [STATE, ...]}"),
    "YAML syntax": (HEAD + "  - image: x\n   command: [t]\n", "4:4: not valid YAML: expected <block end>, but found "
                                                               "'<block mapping start>'"),
    "empty": ("", "1:1: the batch file is empty: it needs billing_project and jobs"),
    "a list": ("- a\n", "1:1: batch file: expected a mapping (key: value), got a list"),
    "no billing_project": ("jobs: []\n", "1:1: batch file: billing_project is required"),
    "top-level typo": ("billing_project: p\njob: []\n", "2:1: batch file: unknown key 'job'; did you mean 'jobs'?"),
    "jobs not a list": ("billing_project: p\njobs: {image: x}\n", "2:7: jobs: expected a list, got a mapping"),
    "project a list": ("billing_project: [a]\n", "1:18: billing_project: expected a string, got a list"),
    "env value a mapping": (HEAD + "  - {image: x, command: [t], env: {N: {a: b}}}\n",
                            "3:39: jobs[0].env.N: expected a string, got a mapping"),
    "a key twice": (HEAD + "  - {image: x, command: [t], image: y}\n", "3:30: jobs[0]: key 'image' is given twice "
                                                                        "(first at 3:6)"),
    "no value": (HEAD + "  - image:\n    command: [t]\n", "3:11: jobs[0].image: expected a string, got nothing"),
    "enum": (HEAD + "  - {image: x, command: [t], network_mode: nonee}\n",
             "3:44: jobs[0].network_mode: unknown value 'nonee' (expected one of none, private, public); did you mean "
             "'none'?"),
    "enum's zero value": (HEAD + "  - {image: x, command: [t], network_mode: unspecified}\n",
                          "3:44: jobs[0].network_mode: unknown value 'unspecified' (expected one of none, private, "
                          "public)"),
    "int32 range": (HEAD + "  - {image: x, command: [t], priority: 2147483648}\n",
                    "3:40: jobs[0].priority: 2147483648 is out of range (-2147483648 to 2147483647)"),
    "bool for int": (HEAD + "  - {image: x, command: [t], max_attempts: true}\n",
                     "3:44: jobs[0].max_attempts: expected a whole number, got True"),
    "duration": (HEAD + "  - {image: x, command: [t], timeout: 90}\n",
                 "3:39: jobs[0].timeout: expected a duration with its unit, such as \"90s\", \"30m\" or \"2h\", got 90"),
    "nested typo": (HEAD + "  - {image: x, command: [t], retry_policy: {max_failed_retry: 3}}\n",
                    "3:45: jobs[0].retry_policy: unknown key 'max_failed_retry'; did you mean 'max_failed_retries'?"),
    "nested type": (HEAD + "  - {image: x, command: [t], resources: {cores_mcpu: 1.5}}\n",
                    "3:54: jobs[0].resources.cores_mcpu: expected a whole number, got 1.5"),
    "list item": (HEAD + "  - {image: x, command: [t], locks: [{level: d, mode: shared, names: [a, ~]}]}\n",
                  "3:74: jobs[0].locks[0].names[1]: expected a string, got nothing"),
    "oneof": (HEAD + "  - {image: x, argv: {args: [a]}, script: hi}\n",
              "3:35: jobs[0].script: argv and script are alternatives (one command): give one of them"),
    "command and script": (HEAD + "  - {image: x, command: [a], script: hi}\n",
                           "3:16: jobs[0].command: command and script say the same thing: give one of them"),
    "cores and machine_type": (HEAD + "  - {image: x, command: [a], cores: 2, machine_type: n2}\n",
                               "3:30: jobs[0].cores: cores and machine_type are alternatives (one size): give one of "
                               "them"),
    "cores twice": (HEAD + "  - {image: x, command: [a], cores: 2, resources: {cores_mcpu: 3}}\n",
                    "3:30: jobs[0].cores: cores and resources.cores_mcpu both set resources.cores_mcpu: give one of "
                    "them"),
    "cores 0": (HEAD + "  - {image: x, command: [a], cores: 0}\n",
                "3:37: jobs[0].cores: 0: at least 0.001 cores (1m)"),
    "a whole number as 2.0": (HEAD + "  - {image: x, command: [a], priority: 2.5}\n",
                              "3:40: jobs[0].priority: expected a whole number, got 2.5"),
    "empty command": (HEAD + "  - {image: x, command: []}\n", "3:25: jobs[0].command: an empty list: give at least "
                                                             "the program to run"),
    "unknown group": (HEAD + "  - {image: x, command: [a], job_group: samples}\n",
                      "3:41: jobs[0].job_group: no job group is named 'samples'"),
    "group without name": ("billing_project: p\njob_groups:\n  - {attributes: {a: b}}\n",
                           "3:5: job_groups[0]: a job group needs a name (jobs refer to it by its name)"),
    "group typo": ("billing_project: p\njob_groups:\n  - {name: g, cancel_after_n_failure: 2}\n",
                   "3:15: job_groups[0]: unknown key 'cancel_after_n_failure'; "
                   "did you mean 'cancel_after_n_failures'?"),
    "duplicate group": ("billing_project: p\njob_groups:\n  - {name: g}\n  - {name: g}\n",
                        "4:12: job_groups[1].name: duplicate job group name 'g' (first at 3:12)"),
    "group cycle": ("billing_project: p\njob_groups:\n  - {name: a, parent: b}\n  - {name: b, parent: a}\n",
                    "4:23: job_groups[1].parent: job group cycle: 'a' is inside 'b', 'b' is inside 'a'"),
    "defaults name": ("billing_project: p\ndefaults: {name: x}\n",
                      "2:12: defaults.name: each job has its own name, not a default one"),
    "defaults typo": ("billing_project: p\ndefaults: {imag: x}\n",
                      "2:12: defaults: unknown key 'imag'; did you mean 'image'?"),
    "nested too deeply": ("billing_project: p\njobs: " + "[" * 5000 + "]" * 5000 + "\n",
                          "1:1: nested too deeply"),
    # Units (corral.quantities): each wrong one named with those accepted.
    "memory: 4GB": (HEAD + "  - image: x\n    command: [t]\n    memory: 4GB\n",
                    "5:13: jobs[0].memory: \"4GB\": unknown unit \"GB\"; use Ki, Mi, Gi, Ti (powers of 1024) or k, "
                    "M, G, T (powers of 1000), e.g. 512Mi or 4G"),
    "storage: 10GiB": (HEAD + "  - {image: x, command: [t], storage: 10GiB}\n",
                       "3:39: jobs[0].storage: \"10GiB\": unknown unit \"GiB\"; use Ki, Mi, Gi, Ti (powers of 1024) "
                       "or k, M, G, T (powers of 1000), e.g. 512Mi or 4G; did you mean \"Gi\"?"),
    "memory: 1.5": (HEAD + "  - {image: x, command: [t], memory: 1.5}\n",
                    "3:38: jobs[0].memory: expected a whole number, got 1.5"),
    "memory_bytes with a unit": (HEAD + "  - {image: x, command: [t], memory_bytes: 4Gi}\n",
                                 "3:44: jobs[0].memory_bytes: expected a whole number of bytes, got '4Gi' (with a "
                                 "unit, write memory: 4Gi)"),
    "memory and memory_bytes": (HEAD + "  - {image: x, command: [t], memory_bytes: 5, memory: 4Gi}\n",
                                "3:47: jobs[0].memory: memory and memory_bytes say the same thing: give one of them"),
    "cores: 250M": (HEAD + "  - {image: x, command: [t], cores: 250M}\n",
                    "3:37: jobs[0].cores: \"250M\": unknown unit \"M\"; write cores (0.25, 2) or milli-cores with m "
                    "(250m)"),
    "cores: 0.0001": (HEAD + "  - {image: x, command: [t], cores: 0.0001}\n",
                      "3:37: jobs[0].cores: 0.0001: at least 0.001 cores (1m)"),
    "timeout: 2hours": (HEAD + "  - {image: x, command: [t], timeout: 2hours}\n",
                        "3:39: jobs[0].timeout: \"2hours\": unknown unit \"hours\"; use ms, s, m (minutes), h or d, "
                        "e.g. 90s, 30m, 2h or 1h30m; did you mean \"h\"?"),
    "timeout: -2s": (HEAD + "  - {image: x, command: [t], timeout: -2s}\n",
                     "3:39: jobs[0].timeout: \"-2s\": a duration cannot be negative"),
    "retry_delay: 5": (HEAD + "  - {image: x, command: [t], retry_policy: {retry_delay: \"5\"}}\n",
                       "3:58: jobs[0].retry_policy.retry_delay: \"5\": a duration needs a unit; use ms, s, m "
                       "(minutes), h or d, e.g. 90s, 30m, 2h or 1h30m"),
    # A batch of no jobs completes at once, having done nothing.
    "jobs: []": ("billing_project: p\njobs: []\n", "2:7: jobs: an empty list: a batch needs at least one job"),
    "no jobs": ("billing_project: p\njob_groups: [{name: g}]\n",
                "1:1: batch file: jobs is required: a batch needs at least one job"),
    "unknown YAML tag": (HEAD + "  - {image: !!python/name:os.system x, command: [a]}\n",
                         "3:13: jobs[0].image: cannot read this value: could not determine a constructor for the tag "
                         "'tag:yaml.org,2002:python/name:os.system'"),
}


@pytest.mark.parametrize("case", MISTAKES)
def test_each_mistake_is_refused_with_its_message_line_and_column(case: str) -> None:
    text, expected = MISTAKES[case]
    with pytest.raises(BatchFileError) as refused:
        parse_batch_file(text, "batch.yaml")
    assert str(refused.value) == f"batch.yaml:{expected}"
    assert isinstance(refused.value, UsageError)
    line_column, message = expected.split(": ", 1)
    assert (refused.value.location, refused.value.message) == (f"batch.yaml:{line_column}", message)


def test_an_unreadable_file_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(BatchFileError, match="cannot read the batch file: No such file or directory") as missing:
        read_batch_file(tmp_path / "missing.yaml")
    assert missing.value.location == str(tmp_path / "missing.yaml")
    (tmp_path / "latin1.yaml").write_bytes(b"billing_project: caf\xe9\n")
    with pytest.raises(BatchFileError, match="not UTF-8 text"):
        read_batch_file(tmp_path / "latin1.yaml")


CLI_TEST_FILE = BATCH_YAML


def test_the_files_the_cli_tests_use_read_as_before() -> None:
    """tests/service/test_cli.py's file, as the old reader made it with BatchBuilder.job (whose explicit
    1 core is the default the frontend applies to a job that gives no size), and the jobs' names now stored
    as their attribute `name`."""
    b = BatchBuilder("proj", attributes={"name": "cli-dag"})
    fetch = b.job("busybox", ["echo", "fetch"], attributes={"name": "fetch"})  # a file's names are stored
    work = b.job("busybox", "echo work", parents=[fetch], attributes={"name": "work"})
    b.job("busybox", ["echo", "cleanup"], parents=[fetch, work], accept=("succeeded", "failed"), always_run=True)
    expected = [_without_size(spec) for spec in b.specs()]
    read = parse_batch_file(CLI_TEST_FILE)
    assert read.specs() == expected
    assert (read.billing_project, read.attributes, read.callback_url) == ("proj", {"name": "cli-dag"}, None)


def _without_size(spec: job_spec_pb2.JobSpec) -> job_spec_pb2.JobSpec:
    assert spec.resources == job_spec_pb2.ResourceRequest(cores_mcpu=1000)
    spec.ClearField("resources")
    return spec


def test_a_generated_file_sets_every_field_and_reads_as_expected() -> None:
    root = "file:///srv/storage/proj"
    read = parse_batch_file(every_field_yaml(root))
    groups, jobs = expected_specs(root)
    assert read.job_group_specs() == groups
    assert read.specs() == jobs
    # A new batch has no absolute ids yet: a file names jobs and groups, never their ids.
    absolute_ids = {"corral.batch.v1.ParentRef.job_id", "corral.batch.v1.JobGroupRef.job_group_id"}
    assert all_fields(job_spec_pb2.JobSpec.DESCRIPTOR) - fields_set(read.specs()) == absolute_ids
    assert all_fields(job_group_pb2.JobGroupSpec.DESCRIPTOR) - fields_set(read.job_group_specs()) == \
        {"corral.batch.v1.JobGroupRef.job_group_id"}
    fields = read.batch_fields()
    assert (fields["billing_project"], fields["attributes"], fields["cancel_after_n_failures"],
            fields["idempotency_token"]) == ("proj", {"name": "every-field"}, 4, "every-field-token")


def test_the_top_level_is_every_other_field_of_submit_batch() -> None:
    """A field added to SubmitBatchRequest must be added to the file (and the builder), not dropped."""
    request = batch_service_pb2.SubmitBatchRequest.DESCRIPTOR
    assert set(BATCH_FIELDS) == {f.name for f in request.fields} - {"jobs", "job_groups"}
    assert {f.name for f in job_group_pb2.JobGroupSpec.DESCRIPTOR.fields} == \
        {"parent", "attributes", "cancel_after_n_failures", "retry_policy"}, "BatchBuilder.job_group takes these"


def test_defaults_merge_into_each_job() -> None:
    read = parse_batch_file("""
billing_project: p
job_groups: [{name: g}]
defaults:
  image: busybox
  command: [echo, default]
  env: {LANG: C.UTF-8, MODE: slow}
  resources: {memory_bytes: 1073741824}
  retry_policy: {max_failed_retries: 2}
  regions: [local, other]
  accept: [failed]
  job_group: g
jobs:
  - name: small
    cores: 0.25
  - name: script
    script: echo "$LANG"
    env: {MODE: fast}
    parents: [small]
  - name: big
    machine_type: n2-highmem-8
    retry_policy: {retry_exit_codes: [75]}
    regions: [local]
    parents: [{job: small, accept: [succeeded]}, script]
    accept: [error]
""")
    small, script, big = read.specs()
    assert small.argv.args == ["echo", "default"] and small.env == {"LANG": "C.UTF-8", "MODE": "slow"}
    assert small.resources == job_spec_pb2.ResourceRequest(cores_mcpu=250, memory_bytes=1073741824)
    assert small.job_group.in_update_index == 0 and list(small.regions) == ["local", "other"]
    assert script.WhichOneof("command") == "script" and script.env == {"LANG": "C.UTF-8", "MODE": "fast"}
    assert [(p.in_update_offset, list(p.accepted_states)) for p in script.parents] == [(-1, [6])]  # FAILED
    assert big.WhichOneof("size") == "machine_type" and big.machine_type == "n2-highmem-8"
    assert big.retry_policy == job_spec_pb2.RetryPolicy(max_failed_retries=2, retry_exit_codes=[75])
    assert list(big.regions) == ["local"]
    assert [(p.in_update_offset, list(p.accepted_states)) for p in big.parents] == [(-2, [5]), (-1, [7])]


def test_sizes_cores_and_durations_as_people_write_them() -> None:
    """Kubernetes' units (docs/batch-file.md, *Sizes, cores and durations*); the forms of before unchanged."""
    new, old = parse_batch_file(HEAD + "  - {image: x, command: [t], memory: 4Gi, storage: 10G, cores: 250m, "
                                "timeout: 1h30m, retry_policy: {retry_delay: 500ms, max_retry_delay: 2m}}\n"
                                "  - {image: x, command: [t], memory_bytes: 4294967296, storage_bytes: 10000000000, "
                                "cores: 0.25, timeout: \"5400s\", retry_policy: {retry_delay: \"0.5s\", "
                                "max_retry_delay: \"120s\"}}\n").specs()
    assert new == old
    assert new.resources == job_spec_pb2.ResourceRequest(cores_mcpu=250, memory_bytes=4 * 2**30,
                                                         storage_bytes=10**10)
    assert new.timeout.ToSeconds() == 5400 and new.retry_policy.retry_delay.ToMilliseconds() == 500
    quoted, = parse_batch_file(HEAD + "  - {image: x, command: [t], cores: \"2\", memory: 512Mi, timeout: 1d}\n"
                               ).specs()
    assert (quoted.resources.cores_mcpu, quoted.resources.memory_bytes, quoted.timeout.ToSeconds()) == \
        (2000, 512 * 2**20, 86400)


def test_enum_values_may_be_written_short_or_by_their_proto_name() -> None:
    short, full = parse_batch_file(HEAD + "  - {image: x, command: [t], network_mode: none, provisioning_model: spot}\n"
                                   "  - {image: x, command: [t], network_mode: NETWORK_MODE_NONE, "
                                   "provisioning_model: PROVISIONING_MODEL_SPOT}\n").specs()
    assert short.network_mode == full.network_mode == job_spec_pb2.NETWORK_MODE_NONE
    assert short.provisioning_model == full.provisioning_model == job_spec_pb2.PROVISIONING_MODEL_SPOT


def test_yaml_anchors_and_merge_keys() -> None:
    read = parse_batch_file("""
billing_project: p
jobs:
  - &base {name: a, image: busybox, command: [echo, a], env: {X: "1"}}
  - <<: *base
    name: b
    command: [echo, b]
""")
    a, b = read.specs()
    assert (list(b.argv.args), b.image, b.env) == (["echo", "b"], "busybox", {"X": "1"})


def test_the_files_own_keys_shadow_only_the_fields_it_writes_by_name() -> None:
    """A job's `name` is the file's; were JobSpec to get a `name` field, the file's key would hide it without
    a word: this fails first, so that the reader passes the name on."""
    spec_fields = {f.name for f in job_spec_pb2.JobSpec.DESCRIPTOR.fields}
    assert (set(JOB_KEYS) | set(SHORTHANDS)) & spec_fields == set(REPLACED_JOB_FIELDS)
    assert set(GROUP_KEYS) & {f.name for f in job_group_pb2.JobGroupSpec.DESCRIPTOR.fields} == {"parent"}


def test_text_fields_take_numbers_and_booleans_as_written() -> None:
    """`command: [sleep, 10]` is common, and a version 1.10 must not become 1.1."""
    spec, = parse_batch_file(HEAD + "  - {image: 3, command: [sleep, 10, 1.10, true, 0x1F], env: {N: 1}, "
                             "attributes: {version: 1.10, day: 2024-01-01, 2024: year}}\n").specs()
    assert (spec.image, list(spec.argv.args)) == ("3", ["sleep", "10", "1.10", "true", "0x1F"])
    assert (dict(spec.env), dict(spec.attributes)) == ({"N": "1"}, {"version": "1.10", "day": "2024-01-01",
                                                                    "2024": "year"})
