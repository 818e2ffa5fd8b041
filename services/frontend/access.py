"""Who may read and change a batch, and what a refused caller is told.

A batch, with its jobs, job groups and logs, is readable by the members of
its billing project, administrators and developers; only its owner and
administrators change it (cancel, delete, new updates, re-runs, cancelling
a group). The answers:

- NOT_FOUND "no batch N": no batch with this id, or it was deleted, or the
  caller may not read it. Those three are one answer, so that nobody learns
  which batch ids exist outside their own projects; the batch is looked up
  with its visibility in one statement, so the time taken does not tell
  them apart either. NOT_FOUND also means no such job or group in a batch
  the caller may read.
- PERMISSION_DENIED: the caller may read the batch (so may know it exists)
  but not change it.

Every servicer that takes a batch id goes through `readable_batch` or
`owned_batch` before anything else touches the database, so a refused call
writes nothing.
"""

from __future__ import annotations

from typing import Any

from services.common.errors import NotFound, PermissionDenied
from services.common.identity import Principal
from services.frontend.batch_store import BatchStore


async def readable_batch(batches: BatchStore, batch_id: int, principal: Principal, include_deleted: bool = False
                         ) -> dict[str, Any]:
    """The batch row if the caller may read it; raises NotFound otherwise, whatever the reason.
    A deleted batch is NotFound unless `include_deleted` (DeleteBatch's repeat)."""
    row = await batches.visible_batch(batch_id, principal, include_deleted)
    if row is None:
        raise NotFound(f"no batch {batch_id}")
    return row


async def owned_batch(batches: BatchStore, batch_id: int, principal: Principal, include_deleted: bool = False
                      ) -> dict[str, Any]:
    """The batch row if the caller may change it: their own, or any for an administrator."""
    row = await readable_batch(batches, batch_id, principal, include_deleted)
    if row["user"] != principal.name and not principal.is_admin:
        raise PermissionDenied(f"batch {batch_id} belongs to {row['user']}")
    return row
