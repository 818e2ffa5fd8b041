"""Messages grouped into bunches, one stream message each: what a stream costs is paid per message."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from google.protobuf.message import Message

M = TypeVar("M", bound=Message)


def bunches(messages: Sequence[M], max_count: int, max_bytes: int, overhead_bytes: int = 0) -> list[list[M]]:
    """`messages`, in order, in runs of at most `max_count` whose sizes (each message's, plus
    `overhead_bytes`) add up to at most `max_bytes`; a message larger than that goes alone."""
    out: list[list[M]] = []
    size = 0
    for message in messages:
        message_bytes = message.ByteSize() + overhead_bytes
        if out and len(out[-1]) < max_count and size + message_bytes <= max_bytes:
            out[-1].append(message)
            size += message_bytes
        else:
            out.append([message])
            size = message_bytes
    return out
