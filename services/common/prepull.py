"""The `--prepull` setting: images a worker pulls when it starts, before its first job needs them.

A worker takes `--prepull IMAGE[,IMAGE...]`; a driver (and `corral up`) takes `--prepull [POOL=]IMAGE[,...]`,
repeatable, and hands each local worker it starts the images of its pool (without `POOL=`: every pool).
Pure: parsing and checks only (the pulls are services.worker.prepull's).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping

from services.common.image_refs import parse_reference

MAX_IMAGES = 32
"""Images one worker pre-pulls at most."""
MAX_REFERENCE_CHARS = 255


def image_list(text: str) -> tuple[str, ...]:
    """`IMAGE[,IMAGE...]` as references, in order, each once; raises ValueError saying what is wrong."""
    images = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    if not images:
        raise ValueError("name at least one image")
    if len(images) > MAX_IMAGES:
        raise ValueError(f"{len(images)} images: at most {MAX_IMAGES}")
    for image in images:
        if len(image) > MAX_REFERENCE_CHARS:
            raise ValueError(f"{image[:80]!r}...: longer than {MAX_REFERENCE_CHARS} characters")
        parse_reference(image)  # the grammar jobs' images follow (InvalidImageReference is a ValueError)
    return images


def images_argument(text: str) -> tuple[str, ...]:
    """`image_list` for argparse (its error is the flag's)."""
    try:
        return image_list(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def pool_images(values: Iterable[str]) -> dict[str | None, tuple[str, ...]]:
    """`[POOL=]IMAGE[,...]` values as pool -> images (None: every pool); a pool given twice gets both lists."""
    found: dict[str | None, tuple[str, ...]] = {}
    for value in values:
        pool, equals, images = value.partition("=")
        key = pool.strip() if equals else None
        if equals and not key:
            raise ValueError(f"{value!r}: a pool name before '='")
        found[key] = image_list(f"{','.join(found.get(key, ()))},{images if equals else value}")
    return found


def for_pool(prepull: Mapping[str | None, tuple[str, ...]], pool: str) -> tuple[str, ...]:
    """The images a worker of `pool` pre-pulls: every pool's, then its own."""
    images = tuple(dict.fromkeys([*prepull.get(None, ()), *prepull.get(pool, ())]))
    return images[:MAX_IMAGES]


def to_args(prepull: Mapping[str | None, tuple[str, ...]]) -> list[str]:
    """The `--prepull` flags that say `prepull` again (for a driver's command line)."""
    return [arg for pool, images in prepull.items()
            for arg in ("--prepull", f"{pool}={','.join(images)}" if pool else ",".join(images))]
