"""What a call with an idempotency token asked for, and the refusal of a token reused for something else.

A token makes a retried call find what the first call made (CreateBatch, SubmitBatch, CreateUpdate,
RerunFailedJobs). A retry sends the same request again; a different request under a token already used
is a mistake (a changed batch file submitted under its old `idempotency_token`), and answering it with
the old batch would let the user believe the changed one ran. So each call stores a digest of its
request beside the token (migration 0027), and the procedures refuse a token whose stored digest differs
(rc 5, ConflictError): ALREADY_EXISTS here, naming the token as the user wrote it and what it made.

The digest is SHA-256 over the message type's full name and its deterministic serialization without the
token: fields in number order, map entries sorted by key, unset and default fields alike absent. The
same request from any client, retried by corral/retries.py or resent by `corral submit`, has the same
digest; the type's name keeps a CreateBatch and a SubmitBatch with one token apart.
"""

from __future__ import annotations

import hashlib

from google.protobuf.message import Message

from services.common.errors import AlreadyExists

TOKEN_FIELD = "idempotency_token"


def request_digest(request: Message) -> str:
    """The request's digest (64 lowercase hex digits), its idempotency token left out."""
    bare = type(request)()
    bare.CopyFrom(request)
    bare.ClearField(TOKEN_FIELD)
    digest = hashlib.sha256(request.DESCRIPTOR.full_name.encode())
    digest.update(b"\n")
    digest.update(bare.SerializeToString(deterministic=True))
    return digest.hexdigest()


def batch_token_conflict(token: str, batch_id: int) -> AlreadyExists:
    """CreateBatch or SubmitBatch with `token` when it made `batch_id` for another request."""
    return AlreadyExists(f'idempotency token "{token}" was used for batch {batch_id} with a different request; '
                         "use a new token to submit a changed batch")


def update_token_conflict(token: str, batch_id: int, update_id: int) -> AlreadyExists:
    """CreateUpdate with `token` when it made `update_id` for another request."""
    return AlreadyExists(f'idempotency token "{token}" was used for update {update_id} of batch {batch_id} with a '
                         "different request; use a new token to create a changed update")


def rerun_token_conflict(token: str, batch_id: int, update_id: int) -> AlreadyExists:
    """RerunFailedJobs with `token` when it re-ran other states as `update_id`."""
    return AlreadyExists(f'idempotency token "{token}" was used for update {update_id} of batch {batch_id} to '
                         "re-run other states; use a new token to re-run these")
