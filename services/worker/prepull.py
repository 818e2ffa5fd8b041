"""Pre-pulling: the images `--prepull` names, pulled into the worker's cache when it starts, one at a time,
while it already takes jobs (a job of one of them waits for the pull in flight rather than starting its own:
services.worker.images shares pulls). A failed pull is logged and the worker carries on: the image is then
pulled when a job needs it, as it would have been without `--prepull`."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from services.worker.image_tools import ImagePullError
from services.worker.images import ImageCache

log = logging.getLogger(__name__)


async def prepull(cache: ImageCache, images: Sequence[str], pulled: Callable[[str], None] = lambda name: None) -> int:
    """Pull each of `images` into `cache`; `pulled(name)` after each that is in it. Returns how many are."""
    n = 0
    for name in images:
        started = time.monotonic()
        try:
            image = await cache.pull(name)
        except (ImagePullError, ValueError) as e:  # ValueError: InvalidImageReference
            log.warning("pre-pull of %s failed (a job of it will pull it again): %s", name, e)
            continue
        n += 1
        pulled(name)
        log.info("pre-pulled %s (%s, %d bytes) in %.1f s", name, image.digest, image.size_bytes,
                 time.monotonic() - started)
    return n
