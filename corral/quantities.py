"""Sizes, cores and durations as people write them: "4Gi", "250m", "2h".

Kubernetes' conventions, so that a number means what it means in a pod spec:

- bytes (memory, storage): a whole number of bytes, or a number with a unit:
  Ki, Mi, Gi, Ti (powers of 1024) or k, M, G, T (powers of 1000). "4Gi" is
  4 x 2^30 bytes, "4G" 4 x 10^9; a fraction is rounded up to a whole byte
  ("1.5Ki" is 1536). "GB", "GiB", "K" and "m" are refused: "GB" means 10^9
  to some and 2^30 to others, and Kubernetes' "m" would be thousandths of a
  byte.
- cores: a number of cores ("0.25", "2") or milli-cores ("250m" is a quarter
  of a core); kept in thousandths (mcpu), rounded to the nearest one, at
  least 1m.
- durations: a number with a unit, ms, s, m (minutes), h or d (24 h), or
  several in a row as Go writes them ("1h30m"); "90" alone is seconds only
  where the caller says a bare number is (a CLI option "in seconds", a
  Python float); kept in nanoseconds, as protobuf's Duration does.

Every refusal is a QuantityError (a ValueError) whose message quotes what
was given and names the accepted units; callers put the key or option in
front (`memory: "4GB": unknown unit "GB"; use ...`). Pure: no I/O, no
corral imports, so the client, the CLI, batch files and the pipeline library
share it (tests/unit/test_quantities.py holds its properties).
"""

from __future__ import annotations

import difflib
import math
import re
from fractions import Fraction

__all__ = [
    "BYTE_UNITS", "BYTES_PATTERN", "DURATION_PATTERN", "DURATION_UNITS", "MCPU_PATTERN", "QuantityError",
    "format_bytes", "format_duration_ns", "format_mcpu", "parse_bytes", "parse_duration_ns", "parse_duration_s",
    "parse_mcpu",
]

MAX_BYTES = 2**63 - 1
"""The most bytes a size may be (protobuf's int64)."""
MAX_MCPU = 10**15
"""The most milli-cores (10^12 cores): more than any machine, finite."""
MAX_DURATION_NS = 99_999_999_999 * 10**9
"""The longest duration: 99,999,999,999 s (some 3,000 years, within the 10,000 a protobuf Duration holds)."""

BYTE_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9,
              "T": 10**12}
"""Byte units and their sizes: Kubernetes' binary (powers of 1024) and decimal (powers of 1000) ones."""
DURATION_UNITS = {"ms": 10**6, "s": 10**9, "m": 60 * 10**9, "h": 3600 * 10**9, "d": 86400 * 10**9}
"""Duration units in nanoseconds (m is minutes; d is 24 hours)."""

_NUMBER = r"[0-9]+(?:\.[0-9]+)?|\.[0-9]+"
BYTES_PATTERN = rf"^(?:[0-9]+|(?:{_NUMBER})(?:Ki|Mi|Gi|Ti|k|M|G|T))$"
"""A size written as text, for JSON Schemas: whole bytes, or a number with a byte unit (its range aside)."""
MCPU_PATTERN = rf"^(?:[0-9]+m|{_NUMBER})$"
"""Cores written as text: whole milli-cores with "m", or cores (its range aside)."""
DURATION_PATTERN = rf"^(?:(?:{_NUMBER})(?:ms|s|m|h|d))+$"
"""A duration written as text, with units (its range aside)."""

_BYTES_HELP = "use Ki, Mi, Gi, Ti (powers of 1024) or k, M, G, T (powers of 1000), e.g. 512Mi or 4G"
_MCPU_HELP = "write cores (0.25, 2) or milli-cores with m (250m)"
_DURATION_HELP = "use ms, s, m (minutes), h or d, e.g. 90s, 30m, 2h or 1h30m"
_SPLIT = re.compile(rf"^({_NUMBER})(.*)$", re.S)
_DURATION_PART = re.compile(rf"({_NUMBER})([^0-9.]*)")
# Units people write that mean one of ours for sure: a hint, never accepted.
_DURATION_WORDS = {"sec": "s", "secs": "s", "second": "s", "seconds": "s", "min": "m", "mins": "m",
                   "minute": "m", "minutes": "m", "hr": "h", "hrs": "h", "hour": "h", "hours": "h", "day": "d",
                   "days": "d", "S": "s", "M": "m", "H": "h", "D": "d", "msec": "ms"}


class QuantityError(ValueError):
    """A size, number of cores or duration that cannot be read; the message says what is accepted."""


def parse_bytes(value: str | int) -> int:
    """Bytes from an int (bytes) or text ("4Gi", "512Mi", "4G", "1000"), rounded up to a whole byte."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise QuantityError(f"{_q(value)}: expected a whole number of bytes or a size such as \"4Gi\"")
    if isinstance(value, int):
        return _bytes_in_range(value, str(value))
    number, unit = _split(value, _BYTES_HELP)
    if not unit:
        if "." in value:
            raise QuantityError(f"{_q(value)}: not a whole number of bytes; {_BYTES_HELP}")
        return _bytes_in_range(int(number), value)
    if unit not in BYTE_UNITS:
        raise QuantityError(f"{_q(value)}: unknown unit {_q(unit)}; {_BYTES_HELP}{_byte_hint(unit)}")
    return _bytes_in_range(math.ceil(number * BYTE_UNITS[unit]), value)


def parse_mcpu(value: str | int | float) -> int:
    """Milli-cores from cores (a number, or text "0.25", "2") or milli-cores as text ("250m"); a number of
    cores is rounded to the nearest thousandth (half to even, as Python's round)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise QuantityError(f"{_q(value)}: expected cores (0.25, 2) or milli-cores (250m)")
    if isinstance(value, float) and 0.001 <= value <= MAX_MCPU / 1000:
        # The fast path (a million-job builder calls this a million times): far from a half, the float
        # product rounds as the exact decimal does; the exact way below settles the rest.
        scaled = value * 1000
        nearest = round(scaled)
        if abs(scaled - nearest) < 0.49:
            return nearest
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_MCPU // 1000:
        return value * 1000
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(f"{_q(value)}: expected a finite number of cores")
        cores = Fraction(repr(value))  # the shortest decimal that is this float: 0.1 is 1/10, not 0.1000000000000000055
        text = repr(value)
    elif isinstance(value, int):
        cores, text = Fraction(value), str(value)
    else:
        text = value
        number, unit = _split(value, _MCPU_HELP)
        if unit == "m":
            if "." in value:
                raise QuantityError(f"{_q(value)}: a fraction of a milli-core; {_MCPU_HELP}")
            return _mcpu_in_range(number, value)
        if unit:
            raise QuantityError(f"{_q(value)}: unknown unit {_q(unit)}; {_MCPU_HELP}")
        cores = number
    if cores < Fraction(1, 1000):
        raise QuantityError(f"{text}: at least 0.001 cores (1m)")
    return _mcpu_in_range(round(cores * 1000), text)  # round: half to even, exactly


def parse_duration_ns(value: str | int | float, bare_unit: str | None = "s") -> int:
    """Nanoseconds from text with units ("90s", "1.5s", "30m", "2h", "1h30m", "250ms", "1d") or a number of
    `bare_unit`s (an int or float, or text without a unit); `bare_unit=None` refuses a number without a unit
    ("90": seconds? minutes?). Rounded to the nearest nanosecond; never negative."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise QuantityError(f"{_q(value)}: expected a duration such as \"90s\" or \"2h\"")
    if isinstance(value, (int, float)):
        if bare_unit is None:
            raise QuantityError(f"{_q(value)}: a duration needs a unit; {_DURATION_HELP}")
        if isinstance(value, float) and not math.isfinite(value):
            raise QuantityError(f"{_q(value)}: expected a finite duration")
        return _ns_in_range(Fraction(repr(value) if isinstance(value, float) else value)
                            * DURATION_UNITS[bare_unit], str(value))
    text = value
    if text.startswith("-"):
        raise QuantityError(f"{_q(value)}: a duration cannot be negative")
    if re.fullmatch(_NUMBER, text):
        if bare_unit is None:
            raise QuantityError(f"{_q(value)}: a duration needs a unit; {_DURATION_HELP}")
        return _ns_in_range(Fraction(text) * DURATION_UNITS[bare_unit], value)
    total = Fraction(0)
    at = 0
    for part in _DURATION_PART.finditer(text):
        if part.start() != at:
            break
        number, unit = part.groups()
        if unit not in DURATION_UNITS:
            if not unit:
                raise QuantityError(f"{_q(value)}: {number} needs a unit; {_DURATION_HELP}")
            raise QuantityError(f"{_q(value)}: unknown unit {_q(unit)}; {_DURATION_HELP}{_duration_hint(unit)}")
        total += Fraction(number) * DURATION_UNITS[unit]
        at = part.end()
    if at != len(text) or not text:
        raise QuantityError(f"{_q(value)}: not a duration; {_DURATION_HELP}")
    return _ns_in_range(total, value)


def parse_duration_s(value: str | int | float, bare_unit: str | None = "s") -> float:
    """parse_duration_ns in seconds (a float: exact to the microsecond for a year's worth)."""
    return parse_duration_ns(value, bare_unit) / 1e9


def format_bytes(n_bytes: int) -> str:
    """`n_bytes` in the largest binary unit that divides it ("4Gi", "1536Ki", "1000"): what parse_bytes reads
    back as the same number."""
    for unit in ("Ti", "Gi", "Mi", "Ki"):
        if n_bytes and n_bytes % BYTE_UNITS[unit] == 0:
            return f"{n_bytes // BYTE_UNITS[unit]}{unit}"
    return str(n_bytes)


def format_mcpu(mcpu: int) -> str:
    """Whole cores as a number ("2"), others in milli-cores ("250m")."""
    return str(mcpu // 1000) if mcpu % 1000 == 0 else f"{mcpu}m"


def format_duration_ns(ns: int) -> str:
    """In the largest units that divide it, Go's way ("1h30m", "90s", "250ms"); sub-millisecond parts as
    decimals of a second ("0.000000001s")."""
    if ns == 0:
        return "0s"
    if ns % DURATION_UNITS["ms"]:
        seconds, nanos = divmod(ns, 10**9)
        return f"{seconds}.{nanos:09d}".rstrip("0") + "s"
    parts = []
    for unit in ("d", "h", "m", "s", "ms"):
        count, ns = divmod(ns, DURATION_UNITS[unit])
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


def _split(text: str, help_text: str) -> tuple[Fraction, str]:
    """(the number at the start of `text`, the rest: its unit)."""
    match = _SPLIT.match(text)
    if match is None:
        raise QuantityError(f"{_q(text)}: not a number; {help_text}")
    return Fraction(match[1]), match[2]


def _q(value: object) -> str:
    """Text quoted as the user wrote it ("4GB"); a number as it is (90)."""
    if not isinstance(value, str):
        return repr(value)
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _space_hint(unit: str, units: dict[str, int]) -> str:
    return "; write the number and its unit together, without a space" if unit.strip() in units else ""


def _bytes_in_range(n_bytes: int, text: str) -> int:
    if not 0 <= n_bytes <= MAX_BYTES:
        raise QuantityError(f"{text}: must be between 0 and {MAX_BYTES} bytes (2^63 - 1)")
    return n_bytes


def _mcpu_in_range(mcpu: int | Fraction, text: str) -> int:
    if not 1 <= mcpu <= MAX_MCPU:
        raise QuantityError(f"{text}: must be at least 1m (0.001 cores) and at most {MAX_MCPU // 1000:,} cores")
    return int(mcpu)


def _ns_in_range(ns: Fraction, text: str) -> int:
    rounded = round(ns)
    if not 0 <= rounded <= MAX_DURATION_NS:
        raise QuantityError(f"{text}: must be between 0s and {MAX_DURATION_NS // 10**9}s")
    return rounded


def _byte_hint(unit: str) -> str:
    if unit.endswith("iB") and unit[:-1] in BYTE_UNITS:
        return f"; did you mean {_q(unit[:-1])}?"
    if unit in ("K", "Ki", "KiB"):
        return '; did you mean "k" or "Ki"?'
    return _space_hint(unit, BYTE_UNITS)


def _duration_hint(unit: str) -> str:
    if unit.strip() in DURATION_UNITS:
        return _space_hint(unit, DURATION_UNITS)
    close = _DURATION_WORDS.get(unit.strip()) or _DURATION_WORDS.get(unit.strip().lower())
    if close is None:
        matches = difflib.get_close_matches(unit, list(DURATION_UNITS), n=1, cutoff=0.6)
        close = matches[0] if matches else None
    return f"; did you mean {_q(close)}?" if close else _space_hint(unit, DURATION_UNITS)
