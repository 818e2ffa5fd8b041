"""What a worker tells its driver about its image cache (ImageCacheReport), so the scheduler can prefer,
all else equal, a worker that already holds a job's image.

Each image in the cache is reported by its digest and the names it goes by: the references it was pulled as
(as the cache normalised them) and the names jobs that ran it wrote (`python:3.11`), which the driver
matches against the image a job's spec names; and apart, the references any job may run it by (pulled without a
job's credentials, and not a project's image of corral's registry), which `corral images ls` lists. The report is bounded (`MAX_IMAGES` images, the most
recently used first, `MAX_NAMES` names each, `MAX_REPORT_BYTES` in all), so a worker holding a thousand
images sends what the driver can use without growing its session's messages.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from corral.driver.v1 import worker_session_pb2 as ws
from services.common.image_refs import OWN_REGISTRY
from services.worker.images import HeldImage, ImageCache

log = logging.getLogger(__name__)

MAX_IMAGES = 64
"""Images in one report at most (the most recently used)."""
MAX_NAMES = 16
"""Names of one image in a report at most."""
MAX_NAME_CHARS = 255
"""A longer name is left out (the driver records no longer image names: jobs.image)."""
MAX_REPORT_BYTES = 32 * 1024
"""A report's size at most: the driver takes messages of up to 64 KiB."""
MAX_JOB_NAMES = 1024
"""Names jobs wrote that are remembered at most (then the oldest are forgotten)."""


def cache_report(held: Sequence[HeldImage], written: dict[str, str]) -> ws.ImageCacheReport:
    """The report of `held` (most recently used first); `written` maps a name a job wrote to the reference the
    cache pulled it as."""
    by_reference: dict[str, list[str]] = {}
    for name, reference in written.items():
        by_reference.setdefault(reference, []).append(name)
    report = ws.ImageCacheReport()
    size = 0
    for image in held[:MAX_IMAGES]:
        names = [*image.references, *(n for r in image.references for n in sorted(by_reference.get(r, ())))]
        names = [n for n in dict.fromkeys(names) if len(n) <= MAX_NAME_CHARS][:MAX_NAMES]
        entry = ws.CachedImage(digest=image.digest, names=names, public_references=public_references(image))
        size += entry.ByteSize() + 4  # the entry's tag and length
        if size > MAX_REPORT_BYTES:
            break
        report.images.append(entry)
    return report


def public_references(image: HeldImage) -> list[str]:
    """The references of `image` any job may run it by (what `corral images ls` may show anybody): none for an
    image pulled with a job's credentials; never a project's image of corral's registry (`localhost/...`, which
    the cache counts as public because it pulls them with the deployment's login)."""
    if not image.public:
        return []
    return [r for r in image.references
            if not r.startswith(f"{OWN_REGISTRY}/") and len(r) <= MAX_NAME_CHARS][:MAX_NAMES]


class ImageReporter:
    """The worker's image cache as its driver is told of it."""

    def __init__(self, cache: ImageCache, normalise: Callable[[str], str]):
        self._cache = cache
        self._normalise = normalise
        """A name as a job writes it -> the reference the cache pulls it as."""
        self._written: dict[str, str] = {}

    def ran(self, name: str) -> bool:
        """A job that wrote its image as `name` started here: its image is in the cache under `name`'s
        reference. Whether `name` is new here (the report may have changed)."""
        if name in self._written:
            return False
        try:
            reference = self._normalise(name)
        except ValueError:
            return False
        if len(self._written) >= MAX_JOB_NAMES:
            del self._written[next(iter(self._written))]
        self._written[name] = reference
        return True

    def report(self) -> ws.ImageCacheReport:
        """What the cache holds now."""
        return cache_report(self._cache.held(), self._written)
