import datetime

from corral.batch.v1 import job_state_pb2 as _job_state_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NetworkMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NETWORK_MODE_UNSPECIFIED: _ClassVar[NetworkMode]
    NETWORK_MODE_NONE: _ClassVar[NetworkMode]
    NETWORK_MODE_PRIVATE: _ClassVar[NetworkMode]
    NETWORK_MODE_PUBLIC: _ClassVar[NetworkMode]

class ProvisioningModel(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROVISIONING_MODEL_UNSPECIFIED: _ClassVar[ProvisioningModel]
    PROVISIONING_MODEL_SPOT: _ClassVar[ProvisioningModel]
    PROVISIONING_MODEL_ON_DEMAND: _ClassVar[ProvisioningModel]

class LockMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LOCK_MODE_UNSPECIFIED: _ClassVar[LockMode]
    LOCK_MODE_NONE: _ClassVar[LockMode]
    LOCK_MODE_SHARED: _ClassVar[LockMode]
    LOCK_MODE_UNKNOWN_SHARED: _ClassVar[LockMode]
    LOCK_MODE_ALL_SHARED: _ClassVar[LockMode]
    LOCK_MODE_EXCLUSIVE: _ClassVar[LockMode]
    LOCK_MODE_UNKNOWN_EXCLUSIVE: _ClassVar[LockMode]
    LOCK_MODE_ALL_EXCLUSIVE: _ClassVar[LockMode]
NETWORK_MODE_UNSPECIFIED: NetworkMode
NETWORK_MODE_NONE: NetworkMode
NETWORK_MODE_PRIVATE: NetworkMode
NETWORK_MODE_PUBLIC: NetworkMode
PROVISIONING_MODEL_UNSPECIFIED: ProvisioningModel
PROVISIONING_MODEL_SPOT: ProvisioningModel
PROVISIONING_MODEL_ON_DEMAND: ProvisioningModel
LOCK_MODE_UNSPECIFIED: LockMode
LOCK_MODE_NONE: LockMode
LOCK_MODE_SHARED: LockMode
LOCK_MODE_UNKNOWN_SHARED: LockMode
LOCK_MODE_ALL_SHARED: LockMode
LOCK_MODE_EXCLUSIVE: LockMode
LOCK_MODE_UNKNOWN_EXCLUSIVE: LockMode
LOCK_MODE_ALL_EXCLUSIVE: LockMode

class JobSpec(_message.Message):
    __slots__ = ("image", "argv", "script", "env", "resources", "machine_type", "regions", "always_run", "timeout", "max_attempts", "input_files", "output_files", "secrets", "network_mode", "attributes", "locks", "priority", "job_group", "parents", "retry_policy", "provisioning_model", "image_pull_secret", "always_copy_outputs")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    ARGV_FIELD_NUMBER: _ClassVar[int]
    SCRIPT_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    MACHINE_TYPE_FIELD_NUMBER: _ClassVar[int]
    REGIONS_FIELD_NUMBER: _ClassVar[int]
    ALWAYS_RUN_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    INPUT_FILES_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FILES_FIELD_NUMBER: _ClassVar[int]
    SECRETS_FIELD_NUMBER: _ClassVar[int]
    NETWORK_MODE_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    LOCKS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    JOB_GROUP_FIELD_NUMBER: _ClassVar[int]
    PARENTS_FIELD_NUMBER: _ClassVar[int]
    RETRY_POLICY_FIELD_NUMBER: _ClassVar[int]
    PROVISIONING_MODEL_FIELD_NUMBER: _ClassVar[int]
    IMAGE_PULL_SECRET_FIELD_NUMBER: _ClassVar[int]
    ALWAYS_COPY_OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    image: str
    argv: Argv
    script: str
    env: _containers.ScalarMap[str, str]
    resources: ResourceRequest
    machine_type: str
    regions: _containers.RepeatedScalarFieldContainer[str]
    always_run: bool
    timeout: _duration_pb2.Duration
    max_attempts: int
    input_files: _containers.RepeatedCompositeFieldContainer[InputFile]
    output_files: _containers.RepeatedCompositeFieldContainer[OutputFile]
    secrets: _containers.RepeatedCompositeFieldContainer[SecretMount]
    network_mode: NetworkMode
    attributes: _containers.ScalarMap[str, str]
    locks: _containers.RepeatedCompositeFieldContainer[JobLock]
    priority: int
    job_group: JobGroupRef
    parents: _containers.RepeatedCompositeFieldContainer[ParentRef]
    retry_policy: RetryPolicy
    provisioning_model: ProvisioningModel
    image_pull_secret: str
    always_copy_outputs: bool
    def __init__(self, image: _Optional[str] = ..., argv: _Optional[_Union[Argv, _Mapping]] = ..., script: _Optional[str] = ..., env: _Optional[_Mapping[str, str]] = ..., resources: _Optional[_Union[ResourceRequest, _Mapping]] = ..., machine_type: _Optional[str] = ..., regions: _Optional[_Iterable[str]] = ..., always_run: _Optional[bool] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., max_attempts: _Optional[int] = ..., input_files: _Optional[_Iterable[_Union[InputFile, _Mapping]]] = ..., output_files: _Optional[_Iterable[_Union[OutputFile, _Mapping]]] = ..., secrets: _Optional[_Iterable[_Union[SecretMount, _Mapping]]] = ..., network_mode: _Optional[_Union[NetworkMode, str]] = ..., attributes: _Optional[_Mapping[str, str]] = ..., locks: _Optional[_Iterable[_Union[JobLock, _Mapping]]] = ..., priority: _Optional[int] = ..., job_group: _Optional[_Union[JobGroupRef, _Mapping]] = ..., parents: _Optional[_Iterable[_Union[ParentRef, _Mapping]]] = ..., retry_policy: _Optional[_Union[RetryPolicy, _Mapping]] = ..., provisioning_model: _Optional[_Union[ProvisioningModel, str]] = ..., image_pull_secret: _Optional[str] = ..., always_copy_outputs: _Optional[bool] = ...) -> None: ...

class Argv(_message.Message):
    __slots__ = ("args",)
    ARGS_FIELD_NUMBER: _ClassVar[int]
    args: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, args: _Optional[_Iterable[str]] = ...) -> None: ...

class ResourceRequest(_message.Message):
    __slots__ = ("cores_mcpu", "memory_bytes", "storage_bytes")
    CORES_MCPU_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    STORAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    cores_mcpu: int
    memory_bytes: int
    storage_bytes: int
    def __init__(self, cores_mcpu: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., storage_bytes: _Optional[int] = ...) -> None: ...

class InputFile(_message.Message):
    __slots__ = ("from_url", "to_path")
    FROM_URL_FIELD_NUMBER: _ClassVar[int]
    TO_PATH_FIELD_NUMBER: _ClassVar[int]
    from_url: str
    to_path: str
    def __init__(self, from_url: _Optional[str] = ..., to_path: _Optional[str] = ...) -> None: ...

class OutputFile(_message.Message):
    __slots__ = ("from_path", "to_url")
    FROM_PATH_FIELD_NUMBER: _ClassVar[int]
    TO_URL_FIELD_NUMBER: _ClassVar[int]
    from_path: str
    to_url: str
    def __init__(self, from_path: _Optional[str] = ..., to_url: _Optional[str] = ...) -> None: ...

class SecretMount(_message.Message):
    __slots__ = ("name", "mount_path")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MOUNT_PATH_FIELD_NUMBER: _ClassVar[int]
    name: str
    mount_path: str
    def __init__(self, name: _Optional[str] = ..., mount_path: _Optional[str] = ...) -> None: ...

class JobLock(_message.Message):
    __slots__ = ("level", "mode", "names")
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    NAMES_FIELD_NUMBER: _ClassVar[int]
    level: str
    mode: LockMode
    names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, level: _Optional[str] = ..., mode: _Optional[_Union[LockMode, str]] = ..., names: _Optional[_Iterable[str]] = ...) -> None: ...

class JobGroupRef(_message.Message):
    __slots__ = ("job_group_id", "in_update_index")
    JOB_GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    IN_UPDATE_INDEX_FIELD_NUMBER: _ClassVar[int]
    job_group_id: int
    in_update_index: int
    def __init__(self, job_group_id: _Optional[int] = ..., in_update_index: _Optional[int] = ...) -> None: ...

class ParentRef(_message.Message):
    __slots__ = ("job_id", "in_update_offset", "accepted_states")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    IN_UPDATE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_STATES_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    in_update_offset: int
    accepted_states: _containers.RepeatedScalarFieldContainer[_job_state_pb2.JobState]
    def __init__(self, job_id: _Optional[int] = ..., in_update_offset: _Optional[int] = ..., accepted_states: _Optional[_Iterable[_Union[_job_state_pb2.JobState, str]]] = ...) -> None: ...

class RetryPolicy(_message.Message):
    __slots__ = ("max_preemptions_before_on_demand", "retry_oom_with_memory_factor", "max_memory_bytes", "max_failed_retries", "retry_exit_codes", "retry_delay", "max_retry_delay")
    MAX_PREEMPTIONS_BEFORE_ON_DEMAND_FIELD_NUMBER: _ClassVar[int]
    RETRY_OOM_WITH_MEMORY_FACTOR_FIELD_NUMBER: _ClassVar[int]
    MAX_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_FAILED_RETRIES_FIELD_NUMBER: _ClassVar[int]
    RETRY_EXIT_CODES_FIELD_NUMBER: _ClassVar[int]
    RETRY_DELAY_FIELD_NUMBER: _ClassVar[int]
    MAX_RETRY_DELAY_FIELD_NUMBER: _ClassVar[int]
    max_preemptions_before_on_demand: int
    retry_oom_with_memory_factor: float
    max_memory_bytes: int
    max_failed_retries: int
    retry_exit_codes: _containers.RepeatedScalarFieldContainer[int]
    retry_delay: _duration_pb2.Duration
    max_retry_delay: _duration_pb2.Duration
    def __init__(self, max_preemptions_before_on_demand: _Optional[int] = ..., retry_oom_with_memory_factor: _Optional[float] = ..., max_memory_bytes: _Optional[int] = ..., max_failed_retries: _Optional[int] = ..., retry_exit_codes: _Optional[_Iterable[int]] = ..., retry_delay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., max_retry_delay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...
