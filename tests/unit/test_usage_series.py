"""An attempt's usage series: its bound, how it thins, and its blob format
(services/common/usage_series.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.common.usage_series import (
    BadUsageBlob,
    UsageHeader,
    UsageReading,
    UsageSample,
    UsageSeries,
    decode,
    encode,
    thinned,
)


def sample(i: int) -> UsageSample:
    return UsageSample(1_000 + i, UsageReading(cpu_time_ms=i, memory_bytes=10 * i, peak_memory_bytes=20 * i))


def test_a_short_series_keeps_every_sample_and_the_final_one_last() -> None:
    series = UsageSeries(cap=10)
    for i in range(5):
        series.add(sample(i))
    series.finish(sample(99))
    assert [s.at_ms for s in series.samples] == [1000, 1001, 1002, 1003, 1004, 1099]
    assert series.stride == 1
    assert series.latest == sample(99)


def test_a_full_series_drops_every_other_sample_and_doubles_its_stride() -> None:
    series = UsageSeries(cap=5)
    for i in range(4):  # the fourth fills cap - 1 places
        series.add(sample(i))
    assert [s.reading.cpu_time_ms for s in series.samples] == [0, 2]
    assert series.stride == 2
    series.add(sample(4))
    series.add(sample(5))  # not on the stride: offered, not kept
    assert [s.reading.cpu_time_ms for s in series.samples] == [0, 2, 4]
    assert series.latest == sample(5)  # the heartbeat reports it all the same


def test_samples_after_the_end_are_ignored() -> None:
    series = UsageSeries(cap=4)
    series.add(sample(0))
    series.finish(sample(9))
    series.add(sample(10))
    assert series.samples == [sample(0), sample(9)]


def test_a_sample_read_while_the_attempt_ended_is_dropped_so_the_series_stays_in_order() -> None:
    series = UsageSeries(cap=10)
    for i in (0, 1, 5):  # the sampler stamped the third when its thread returned, after the job's end at 3
        series.add(sample(i))
    series.finish(sample(3))
    assert [s.at_ms for s in series.samples] == [1000, 1001, 1003]
    assert series.latest == sample(3)


def test_the_cap_must_leave_room_for_a_periodic_and_the_final_sample() -> None:
    with pytest.raises(ValueError):
        UsageSeries(cap=1)


@given(cap=st.integers(2, 50), offered=st.integers(0, 2000), finished=st.booleans())
def test_the_bound_holds_and_what_is_kept_is_every_stride_th_sample(cap: int, offered: int, finished: bool) -> None:
    series = UsageSeries(cap)
    for i in range(offered):
        series.add(sample(i))
        assert len(series.samples) <= cap - 1
    if finished:
        series.finish(sample(10_000))
    kept = series.samples
    assert len(kept) <= cap
    periodic = kept[:-1] if finished else kept
    # Evenly spread: exactly the offered samples on the stride, in order.
    assert [s.reading.cpu_time_ms for s in periodic] == list(range(0, offered, series.stride))
    if offered >= cap:  # thinned no further than it had to be: at least half the places in use
        assert len(periodic) >= (cap - 1) // 2
    if finished:
        assert kept[-1] == sample(10_000)


counters = st.none() | st.integers(0, 2**62)
readings = st.builds(UsageReading, cpu_time_ms=counters, memory_bytes=counters, peak_memory_bytes=counters,
                     io_read_bytes=counters, io_write_bytes=counters)


@given(samples=st.lists(st.builds(UsageSample, st.integers(0, 2**50), readings), max_size=20),
       note=st.text(max_size=40), stride=st.integers(1, 64))
def test_the_blob_reads_back_as_written(samples: list[UsageSample], note: str, stride: int) -> None:
    header = UsageHeader("oci", 250, stride, note)
    assert decode(encode(header, samples)) == (header, samples)


def test_the_blob_is_json_lines_with_a_header_and_unknown_counters_left_out() -> None:
    blob = encode(UsageHeader("process", 0, 1, "no sampling"),
                  [UsageSample(5, UsageReading(cpu_time_ms=7, peak_memory_bytes=9))])
    assert blob.decode().splitlines() == [
        '{"corral_usage":1,"runtime":"process","interval_ms":0,"stride":1,"note":"no sampling"}',
        '{"at_ms":5,"cpu_time_ms":7,"peak_memory_bytes":9}',
    ]


@pytest.mark.parametrize("blob", [b"", b"\xff", b"[]\n", b'{"corral_usage":2,"runtime":"x","interval_ms":0}\n',
                                  b'{"corral_usage":1,"runtime":"x","interval_ms":0}\n{"cpu_time_ms":1}\n',
                                  b'{"corral_usage":1,"runtime":"x","interval_ms":0}\n[1]\n'])
def test_anything_else_is_refused(blob: bytes) -> None:
    with pytest.raises(BadUsageBlob):
        decode(blob)


@given(n=st.integers(0, 5000), most=st.integers(2, 1000))
def test_thinning_keeps_the_ends_and_the_order_within_the_bound(n: int, most: int) -> None:
    kept = thinned(list(range(n)), most)
    assert len(kept) == min(n, most) and kept == sorted(set(kept))
    if n:
        assert (kept[0], kept[-1]) == (0, n - 1)
