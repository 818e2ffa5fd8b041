import datetime

from corral.authz.v1 import authz_pb2 as _authz_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EnrollRequest(_message.Message):
    __slots__ = ("instance_name", "activation_token", "csr_pem")
    INSTANCE_NAME_FIELD_NUMBER: _ClassVar[int]
    ACTIVATION_TOKEN_FIELD_NUMBER: _ClassVar[int]
    CSR_PEM_FIELD_NUMBER: _ClassVar[int]
    instance_name: str
    activation_token: str
    csr_pem: str
    def __init__(self, instance_name: _Optional[str] = ..., activation_token: _Optional[str] = ..., csr_pem: _Optional[str] = ...) -> None: ...

class EnrollResponse(_message.Message):
    __slots__ = ("certificate_chain_pem", "not_after")
    CERTIFICATE_CHAIN_PEM_FIELD_NUMBER: _ClassVar[int]
    NOT_AFTER_FIELD_NUMBER: _ClassVar[int]
    certificate_chain_pem: str
    not_after: _timestamp_pb2.Timestamp
    def __init__(self, certificate_chain_pem: _Optional[str] = ..., not_after: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class RenewRequest(_message.Message):
    __slots__ = ("csr_pem",)
    CSR_PEM_FIELD_NUMBER: _ClassVar[int]
    csr_pem: str
    def __init__(self, csr_pem: _Optional[str] = ...) -> None: ...

class RenewResponse(_message.Message):
    __slots__ = ("certificate_chain_pem", "not_after")
    CERTIFICATE_CHAIN_PEM_FIELD_NUMBER: _ClassVar[int]
    NOT_AFTER_FIELD_NUMBER: _ClassVar[int]
    certificate_chain_pem: str
    not_after: _timestamp_pb2.Timestamp
    def __init__(self, certificate_chain_pem: _Optional[str] = ..., not_after: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...
