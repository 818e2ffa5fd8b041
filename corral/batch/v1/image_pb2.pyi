from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class Image(_message.Message):
    __slots__ = ("reference", "billing_project", "name", "tag", "digest", "size_bytes", "layers", "workers_holding")
    REFERENCE_FIELD_NUMBER: _ClassVar[int]
    BILLING_PROJECT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_HOLDING_FIELD_NUMBER: _ClassVar[int]
    reference: str
    billing_project: str
    name: str
    tag: str
    digest: str
    size_bytes: int
    layers: int
    workers_holding: int
    def __init__(self, reference: _Optional[str] = ..., billing_project: _Optional[str] = ..., name: _Optional[str] = ..., tag: _Optional[str] = ..., digest: _Optional[str] = ..., size_bytes: _Optional[int] = ..., layers: _Optional[int] = ..., workers_holding: _Optional[int] = ...) -> None: ...
