"""services/worker/disk.py: telling a full scratch disk, on a real small filesystem where we may mount one."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.worker.disk import is_full, out_of_space, ran_out, reports_out_of_space


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs (needs root)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], check=True)
    try:
        yield disk
    finally:
        subprocess.run(["umount", "--lazy", str(disk)], check=True)


def test_a_disk_is_full_once_written_up_and_not_after(small_disk: Path) -> None:
    assert not is_full(small_disk / "attempt" / "work")  # an ancestor that exists answers for a path that does not
    with pytest.raises(OSError) as raised, open(small_disk / "fill", "wb") as f:
        f.write(b"\0" * 2 * 2**20)
        f.flush()
    assert raised.value.errno == errno.ENOSPC and out_of_space(raised.value)
    assert is_full(small_disk)
    assert ran_out(small_disk).startswith(f"the worker's scratch disk ran out of space ({small_disk}: ")
    (small_disk / "fill").unlink()
    assert not is_full(small_disk)


def test_out_of_space_looks_through_the_causes() -> None:
    try:
        try:
            raise OSError(errno.EDQUOT, "Disk quota exceeded")
        except OSError as e:
            raise RuntimeError("copying input files failed") from e
    except RuntimeError as wrapped:
        assert out_of_space(wrapped)
    assert not out_of_space(OSError(errno.EACCES, "Permission denied"))
    assert not out_of_space(ValueError("no"))


def test_what_programs_print_for_enospc_and_edquot() -> None:
    assert reports_out_of_space(b"dd: error writing 'fill': No space left on device\n")
    assert reports_out_of_space(b"write: DISK QUOTA EXCEEDED")
    assert not reports_out_of_space(b"exited with code 1")
