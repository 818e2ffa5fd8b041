from corral.batch.v1 import image_pb2 as _image_pb2
from google.api import annotations_pb2 as _annotations_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ImportImageHeader(_message.Message):
    __slots__ = ("billing_project", "name", "tag", "size_bytes")
    BILLING_PROJECT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    billing_project: str
    name: str
    tag: str
    size_bytes: int
    def __init__(self, billing_project: _Optional[str] = ..., name: _Optional[str] = ..., tag: _Optional[str] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class ImportImageRequest(_message.Message):
    __slots__ = ("header", "chunk")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    header: ImportImageHeader
    chunk: bytes
    def __init__(self, header: _Optional[_Union[ImportImageHeader, _Mapping]] = ..., chunk: _Optional[bytes] = ...) -> None: ...

class ImportImageResponse(_message.Message):
    __slots__ = ("image",)
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    image: _image_pb2.Image
    def __init__(self, image: _Optional[_Union[_image_pb2.Image, _Mapping]] = ...) -> None: ...

class ListImagesRequest(_message.Message):
    __slots__ = ("billing_project", "page_size", "page_token")
    BILLING_PROJECT_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    billing_project: str
    page_size: int
    page_token: str
    def __init__(self, billing_project: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListImagesResponse(_message.Message):
    __slots__ = ("images", "next_page_token", "workers_unknown")
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    WORKERS_UNKNOWN_FIELD_NUMBER: _ClassVar[int]
    images: _containers.RepeatedCompositeFieldContainer[_image_pb2.Image]
    next_page_token: str
    workers_unknown: str
    def __init__(self, images: _Optional[_Iterable[_Union[_image_pb2.Image, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., workers_unknown: _Optional[str] = ...) -> None: ...

class DeleteImageRequest(_message.Message):
    __slots__ = ("billing_project", "name", "tag")
    BILLING_PROJECT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    billing_project: str
    name: str
    tag: str
    def __init__(self, billing_project: _Optional[str] = ..., name: _Optional[str] = ..., tag: _Optional[str] = ...) -> None: ...

class DeleteImageResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
