"""How an amount of bytes is said to people: in the largest binary unit
that leaves at least one of it ("16 GiB", "10 PiB", "512 MiB"), so that the
frontend's refusals, the planner's wait reasons and the worker's refusals
name a size the same way."""

from __future__ import annotations

_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def binary_size(n_bytes: int) -> str:
    """`n_bytes` as '16 GiB', to one decimal as people read sizes ('2.7 MiB', not '2.66406 MiB'; a whole
    number without one); under 1 KiB, '100 bytes'."""
    for power in range(len(_UNITS), 0, -1):
        unit = 1 << (10 * power)
        if n_bytes >= unit:
            return f"{n_bytes / unit:.1f}".removesuffix(".0") + f" {_UNITS[power - 1]}"
    return f"{n_bytes} bytes"
