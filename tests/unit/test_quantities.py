"""corral.quantities: sizes, cores and durations as people write them. Round trips, monotonicity, the
Kubernetes meanings, and every unit that is not one refused with the accepted ones named."""

from __future__ import annotations

import re
import string
from fractions import Fraction

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from corral import quantities as q
from corral.quantities import QuantityError

BYTES_UNITS = list(q.BYTE_UNITS)
sizes = st.integers(0, q.MAX_BYTES)
mcpus = st.integers(1, q.MAX_MCPU)
durations_ns = st.integers(0, q.MAX_DURATION_NS)
# What people put after a number that is not a unit of ours (a few letters, spaces, a B, a case changed).
odd_units = st.text(alphabet=string.ascii_letters + " iB%", min_size=1, max_size=4)


@pytest.mark.parametrize(("text", "n_bytes"), [
    ("4Gi", 4 * 2**30), ("4G", 4 * 10**9), ("512Mi", 512 * 2**20), ("10Gi", 10 * 2**30), ("1k", 1000),
    ("1Ki", 1024), ("2Ti", 2 * 2**40), ("3T", 3 * 10**12), ("1.5Gi", 1536 * 2**20), ("0.5Ki", 512),
    ("1.3Ki", 1332), ("1000", 1000), ("0", 0), (".5M", 500_000), (4096, 4096)])
def test_sizes_as_kubernetes_reads_them(text: str | int, n_bytes: int) -> None:
    assert q.parse_bytes(text) == n_bytes


@pytest.mark.parametrize(("text", "mcpu"), [
    ("250m", 250), ("0.25", 250), (0.25, 250), ("2", 2000), (2, 2000), (0.1, 100), ("1m", 1), (0.001, 1),
    (1.0005, 1000), (1.0015, 1002), ("64", 64000)])
def test_cores_as_kubernetes_reads_them(text: str | float, mcpu: int) -> None:
    assert q.parse_mcpu(text) == mcpu


@pytest.mark.parametrize(("text", "seconds"), [
    ("2h", 7200), ("30m", 1800), ("90s", 90), ("1.5s", 1.5), ("1h30m", 5400), ("250ms", 0.25), ("1d", 86400),
    ("0.000000001s", 1e-9), ("0s", 0), (90, 90), (1.5, 1.5), ("3600", 3600)])
def test_durations_as_people_write_them(text: str | float, seconds: float) -> None:
    assert q.parse_duration_s(text) == pytest.approx(seconds, abs=1e-12)


@pytest.mark.parametrize(("call", "message"), [
    (lambda: q.parse_bytes("4GB"), '"4GB": unknown unit "GB"; use Ki, Mi, Gi, Ti (powers of 1024) or k, M, G, '
                                   'T (powers of 1000), e.g. 512Mi or 4G'),
    (lambda: q.parse_bytes("4GiB"), '"4GiB": unknown unit "GiB"; use Ki, Mi, Gi, Ti (powers of 1024) or k, M, '
                                    'G, T (powers of 1000), e.g. 512Mi or 4G; did you mean "Gi"?'),
    (lambda: q.parse_bytes("4K"), '"4K": unknown unit "K"; use Ki, Mi, Gi, Ti (powers of 1024) or k, M, G, T '
                                  '(powers of 1000), e.g. 512Mi or 4G; did you mean "k" or "Ki"?'),
    (lambda: q.parse_bytes("512m"), '"512m": unknown unit "m"; use Ki, Mi, Gi, Ti (powers of 1024) or k, M, G, '
                                    'T (powers of 1000), e.g. 512Mi or 4G'),
    (lambda: q.parse_bytes("1.5"), '"1.5": not a whole number of bytes; use Ki, Mi, Gi, Ti (powers of 1024) or '
                                   'k, M, G, T (powers of 1000), e.g. 512Mi or 4G'),
    (lambda: q.parse_bytes(-1), "-1: must be between 0 and 9223372036854775807 bytes (2^63 - 1)"),
    (lambda: q.parse_mcpu("250M"), '"250M": unknown unit "M"; write cores (0.25, 2) or milli-cores with m (250m)'),
    (lambda: q.parse_mcpu("1.5m"), '"1.5m": a fraction of a milli-core; write cores (0.25, 2) or milli-cores '
                                   'with m (250m)'),
    (lambda: q.parse_mcpu(0.0004), "0.0004: at least 0.001 cores (1m)"),
    (lambda: q.parse_mcpu(0), "0: at least 0.001 cores (1m)"),
    (lambda: q.parse_duration_s("2hours"), '"2hours": unknown unit "hours"; use ms, s, m (minutes), h or d, e.g. '
                                           '90s, 30m, 2h or 1h30m; did you mean "h"?'),
    (lambda: q.parse_duration_s("1h30"), '"1h30": 30 needs a unit; use ms, s, m (minutes), h or d, e.g. 90s, '
                                         '30m, 2h or 1h30m'),
    (lambda: q.parse_duration_s("-5s"), '"-5s": a duration cannot be negative'),
    (lambda: q.parse_duration_s("90", None), '"90": a duration needs a unit; use ms, s, m (minutes), h or d, '
                                             'e.g. 90s, 30m, 2h or 1h30m'),
])
def test_refusals_name_what_is_accepted(call, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(QuantityError) as refused:
        call()
    assert str(refused.value) == message


@given(sizes)
def test_a_size_reads_back_from_its_text(n_bytes: int) -> None:
    assert q.parse_bytes(q.format_bytes(n_bytes)) == n_bytes
    assert q.parse_bytes(str(n_bytes)) == q.parse_bytes(n_bytes) == n_bytes


@given(mcpus)
def test_cores_read_back_from_their_text_and_as_a_float(mcpu: int) -> None:
    assert q.parse_mcpu(q.format_mcpu(mcpu)) == mcpu
    assert q.parse_mcpu(f"{mcpu}m") == mcpu
    assert q.parse_mcpu(mcpu / 1000) == mcpu  # a float of cores: what Python code writes


@given(durations_ns)
def test_a_duration_reads_back_from_its_text(ns: int) -> None:
    assert q.parse_duration_ns(q.format_duration_ns(ns), None) == ns


@given(st.integers(0, 10**6), st.integers(0, 10**6), st.sampled_from(BYTES_UNITS))
def test_sizes_grow_with_their_number(a: int, b: int, unit: str) -> None:
    small, large = sorted((a, b))
    assert q.parse_bytes(f"{small}{unit}") <= q.parse_bytes(f"{large}{unit}")
    assert q.parse_bytes(f"{large}{unit}") == large * q.BYTE_UNITS[unit]


@given(st.decimals(min_value="0.001", max_value="1000000", places=4),
       st.decimals(min_value="0.001", max_value="1000000", places=4))
def test_cores_grow_with_their_number(a, b) -> None:  # type: ignore[no-untyped-def]
    small, large = sorted((a, b))
    assert q.parse_mcpu(str(small)) <= q.parse_mcpu(str(large))


@given(st.integers(0, 10**5), st.integers(0, 10**5), st.sampled_from(list(q.DURATION_UNITS)),
       st.sampled_from(list(q.DURATION_UNITS)))
def test_durations_grow_with_their_number_and_add_up(a: int, b: int, unit: str, other: str) -> None:
    small, large = sorted((a, b))
    assert q.parse_duration_ns(f"{small}{unit}") <= q.parse_duration_ns(f"{large}{unit}")
    assert q.parse_duration_ns(f"{a}{unit}{b}{other}") == q.parse_duration_ns(f"{a}{unit}") + \
        q.parse_duration_ns(f"{b}{other}")


@given(st.integers(1, 1000), odd_units)
def test_every_other_size_unit_is_refused_naming_the_accepted_ones(number: int, unit: str) -> None:
    assume(unit not in q.BYTE_UNITS and not re.fullmatch(r"[0-9]*", unit))
    with pytest.raises(QuantityError, match=r"Ki, Mi, Gi, Ti \(powers of 1024\) or k, M, G, T \(powers of 1000\)"):
        q.parse_bytes(f"{number}{unit}")
    assert not re.fullmatch(q.BYTES_PATTERN, f"{number}{unit}")  # the schema refuses it too


@given(st.integers(1, 1000), odd_units)
def test_every_other_core_unit_is_refused_naming_the_accepted_ones(number: int, unit: str) -> None:
    assume(unit != "m")
    with pytest.raises(QuantityError, match=r"cores \(0\.25, 2\) or milli-cores with m \(250m\)"):
        q.parse_mcpu(f"{number}{unit}")
    assert not re.fullmatch(q.MCPU_PATTERN, f"{number}{unit}")


@given(st.integers(1, 1000), odd_units)
def test_every_other_duration_unit_is_refused_naming_the_accepted_ones(number: int, unit: str) -> None:
    assume(unit not in q.DURATION_UNITS)
    with pytest.raises(QuantityError, match=r"ms, s, m \(minutes\), h or d"):
        q.parse_duration_ns(f"{number}{unit}")
    assert not re.fullmatch(q.DURATION_PATTERN, f"{number}{unit}")


@given(st.text(max_size=8))
def test_the_patterns_accept_exactly_the_forms_the_parsers_read(text: str) -> None:
    """Within range, a text matches a schema pattern exactly when its parser reads it."""
    for pattern, parse in ((q.BYTES_PATTERN, q.parse_bytes), (q.MCPU_PATTERN, q.parse_mcpu),
                           (q.DURATION_PATTERN, lambda t: q.parse_duration_ns(t, None))):
        try:
            parse(text)
            parsed = True
        except QuantityError as e:
            parsed = False
            if "at least" in str(e) or "between" in str(e):
                continue  # the range: the parser's to check, not a pattern's
        assert bool(re.fullmatch(pattern, text)) == parsed, (pattern, text)


@pytest.mark.parametrize("value", [True, None, [1], float("inf"), float("nan")])
def test_what_is_no_quantity_at_all_is_refused(value: object) -> None:
    for parse in (q.parse_bytes, q.parse_mcpu, q.parse_duration_ns):
        with pytest.raises(QuantityError):
            parse(value)  # type: ignore[arg-type]


@given(st.floats(min_value=0.001, max_value=1e12) | st.integers(1, 10**6).map(lambda m: m / 1000 + 0.0005))
def test_a_float_of_cores_is_read_as_its_exact_decimal(cores: float) -> None:
    """The fast path for floats (a million-job builder) agrees with the exact decimal the float prints as,
    halves included."""
    assert q.parse_mcpu(cores) == round(Fraction(repr(cores)) * 1000)
