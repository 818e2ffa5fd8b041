"""A job's cpu, memory, storage and timeout as hailtop.batch takes them, read with corral.quantities.

Pure: each function takes what the user wrote and returns a number, or raises a ValueError (a
`corral.quantities.QuantityError`) whose message names the setting, so that a wrong value is refused where
it is written, before anything runs or is submitted.
"""

from __future__ import annotations

from corral import quantities

MEMORY_PER_CORE_BYTES = {"lowmem": 1 * 2**30, "standard": 4 * 2**30, "highmem": 7 * 2**30}
"""hailtop.batch's memory classes, in bytes per core: a job asking for 'standard' with 2 cores reserves
8 GiB. The ratios are those hailtop.batch's LocalBackend uses; corral has no worker types to pick from."""


def cpu_mcpu(value: str | int | float) -> int:
    """Milli-cores from a number of cores (1, 0.25, "2") or milli-cores ("250m")."""
    return _named("cpu", quantities.parse_mcpu, value)


def check_memory(value: str | int) -> str | int:
    """`value` if it is a memory class ('lowmem', 'standard', 'highmem') or a size ('1Gi', bytes)."""
    if isinstance(value, str) and value in MEMORY_PER_CORE_BYTES:
        return value
    try:
        _named("memory", quantities.parse_bytes, value)
    except quantities.QuantityError as e:
        raise quantities.QuantityError(f"{e}, or one of 'lowmem', 'standard', 'highmem'") from None
    return value


def memory_bytes(value: str | int, mcpu: int) -> int:
    """Bytes of memory for a job of `mcpu` milli-cores (a memory class scales with the cores)."""
    if isinstance(value, str) and value in MEMORY_PER_CORE_BYTES:
        return MEMORY_PER_CORE_BYTES[value] * mcpu // 1000
    return _named("memory", quantities.parse_bytes, value)


def storage_bytes(value: str | int) -> int:
    """Bytes of scratch storage ("10Gi", or bytes)."""
    return _named("storage", quantities.parse_bytes, value)


def timeout_s(value: str | int | float) -> float:
    """Seconds: a number (hailtop.batch's way) or a duration with its unit ("90s", "2h")."""
    return _named("timeout", quantities.parse_duration_s, value)


def _named(name: str, parse, value):  # type: ignore[no-untyped-def]
    try:
        return parse(value)
    except quantities.QuantityError as e:
        raise quantities.QuantityError(f"{name}: {e}") from None
