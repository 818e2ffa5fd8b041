"""An attempt's resource usage over time: the samples, the bound on how many
an attempt keeps, and the blob format they are stored in. Pure: no I/O.

**The bound.** A series keeps at most `cap` samples. Periodic samples are
offered one by one; the series keeps every `stride`-th of them (stride 1 at
first). When the periodic samples fill `cap - 1` places, every other one
is dropped (the first is kept) and the stride doubles, so the kept samples
stay evenly spread over the whole attempt, however long it runs, at between
half and all of the cap. The last place is kept for the end-of-attempt
reading (`finish`), which is always the series' last sample. Nothing is
lost that the kernel counts cumulatively: cpu time, peak memory and I/O
bytes only grow, so a later sample includes what a dropped one said; only
the current memory between two kept samples is forgotten.

**The blob** (`usage.jsonl`, next to the attempt's `main.log`): JSON
lines, UTF-8. The first line is a header, `{"corral_usage": 1, "runtime":
…, "interval_ms": …, "stride": …, "note": …}`; each further line is one
sample, oldest first: `{"at_ms": …, "cpu_time_ms": …, "memory_bytes": …,
"peak_memory_bytes": …, "io_read_bytes": …, "io_write_bytes": …}`, a
counter left out where the runtime could not read it.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import TypeVar

FORMAT_VERSION = 1
DEFAULT_CAP = 720
"""Samples kept per attempt unless configured: an hour at 5 s, then evenly thinner."""
FILE_NAME = "usage.jsonl"
_COUNTERS = ("cpu_time_ms", "memory_bytes", "peak_memory_bytes", "io_read_bytes", "io_write_bytes")


@dataclass(frozen=True)
class UsageReading:
    """What a runtime read of one attempt's counters at one moment (None: it cannot tell)."""

    cpu_time_ms: int | None = None
    """CPU time so far, user + system, over all cores."""
    memory_bytes: int | None = None
    """Memory in use now (the cgroup's current charge); None at the end, once the processes are gone."""
    peak_memory_bytes: int | None = None
    """Most memory in use at once so far."""
    io_read_bytes: int | None = None
    """Bytes read from block devices so far."""
    io_write_bytes: int | None = None
    """Bytes written to block devices so far."""


@dataclass(frozen=True)
class UsageSample:
    """A reading and when it was taken."""

    at_ms: int
    """Milliseconds since the epoch."""
    reading: UsageReading


@dataclass(frozen=True)
class UsageHeader:
    """What the series is: who measured it and how often."""

    runtime: str
    """The runtime that read the counters ('oci', 'process')."""
    interval_ms: int
    """Time between two periodic samples before any thinning (0: none were taken)."""
    stride: int = 1
    """Every `stride`-th periodic sample was kept (the series was thinned to fit its cap)."""
    note: str = ""
    """What the runtime could not measure, in words; empty if nothing is missing."""


class UsageSeries:
    """The bounded series of one attempt (see the module docstring)."""

    def __init__(self, cap: int = DEFAULT_CAP):
        if cap < 2:
            raise ValueError("cap must be at least 2 (a periodic sample and the final one)")
        self.cap = cap
        self.stride = 1
        self._offered = 0
        self._samples: list[UsageSample] = []
        self._final: UsageSample | None = None
        self.latest: UsageSample | None = None
        """The last sample offered, kept or not (what the heartbeat reports)."""

    def add(self, sample: UsageSample) -> None:
        """Offer a periodic sample; kept if it falls on the stride. Ignored once finished."""
        if self._final is not None:
            return
        self.latest = sample
        index, self._offered = self._offered, self._offered + 1
        if index % self.stride:
            return
        self._samples.append(sample)
        if len(self._samples) >= self.cap - 1 and len(self._samples) > 1:
            del self._samples[1::2]  # the kept ones were offered at multiples of the doubled stride
            self.stride *= 2

    def finish(self, sample: UsageSample) -> None:
        """The end-of-attempt reading: the series' last sample. A periodic sample stamped after it was read
        while the attempt was ending (the sampler stamps a reading when its thread returns) and is dropped,
        so that the series stays in time order."""
        while self._samples and self._samples[-1].at_ms > sample.at_ms:
            self._samples.pop()
        self.latest = self._final = sample

    @property
    def sampled(self) -> bool:
        """Whether any periodic sample was offered (a runtime that cannot sample a running job offers none)."""
        return self._offered > 0

    @property
    def samples(self) -> list[UsageSample]:
        """The kept samples, oldest first, the final one last once finished."""
        return self._samples + ([self._final] if self._final is not None else [])


T = TypeVar("T")


def thinned(samples: list[T], most: int) -> list[T]:
    """At most `most` (at least 2) of `samples`, evenly spread, the first and the last kept (what a reader is
    given of a series longer than it asks for)."""
    if len(samples) <= most:
        return samples
    step = (len(samples) - 1) / (most - 1)
    return [samples[round(i * step)] for i in range(most)]


def encode(header: UsageHeader, samples: list[UsageSample]) -> bytes:
    """The blob for a series (see the module docstring)."""
    lines = [json.dumps({"corral_usage": FORMAT_VERSION, **dataclasses.asdict(header)}, separators=(",", ":"))]
    for sample in samples:
        fields = {"at_ms": sample.at_ms}
        fields.update((name, value) for name in _COUNTERS
                      if (value := getattr(sample.reading, name)) is not None)
        lines.append(json.dumps(fields, separators=(",", ":")))
    return ("\n".join(lines) + "\n").encode()


class BadUsageBlob(ValueError):
    """The blob is not a usage series this code can read."""


def decode(blob: bytes) -> tuple[UsageHeader, list[UsageSample]]:
    """A blob written by `encode`; raises BadUsageBlob for anything else."""
    try:
        lines = blob.decode().splitlines()
        first = json.loads(lines[0])
        if not isinstance(first, dict) or first.get("corral_usage") != FORMAT_VERSION:
            raise BadUsageBlob("not a usage series of format 1")
        header = UsageHeader(str(first["runtime"]), int(first["interval_ms"]), int(first.get("stride", 1)),
                             str(first.get("note", "")))
        samples = []
        for line in lines[1:]:
            fields = json.loads(line)
            reading = UsageReading(**{name: int(fields[name]) for name in _COUNTERS if fields.get(name) is not None})
            samples.append(UsageSample(int(fields["at_ms"]), reading))
    except BadUsageBlob:
        raise
    except (UnicodeDecodeError, IndexError, KeyError, TypeError, AttributeError, ValueError) as e:
        raise BadUsageBlob(f"not a usage series: {e}") from None
    return header, samples
