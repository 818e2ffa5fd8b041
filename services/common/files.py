"""Files that other processes read while this one may be writing them."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomically(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write `path` whole or not at all, with exactly `mode`: a temporary file
    beside it, renamed into place, so a reader never sees it empty or half
    written."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    os.fchmod(fd, mode)  # exactly `mode`, whatever the umask (services run with 077)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(partial, path)
