"""What the live workers' image caches hold, by digest (DriverService.ListHeldImages, for `corral images ls`).

Each worker session keeps its worker's latest ImageCacheReport by digest (services.driver.sessions); this
merges them: per digest, how many workers hold it, the references any job may run it by, and which instances.
The answer is bounded whatever the fleet (`MAX_HELD_IMAGES` images, the most widely held first, and
`MAX_ANSWER_BYTES`), so a fleet of a thousand workers of 64 images each cannot make it grow without end.
"""

from __future__ import annotations

from collections.abc import Mapping

from corral.driver.v1 import driver_service_pb2 as pb

MAX_HELD_IMAGES = 1000
"""Images in one answer at most."""
MAX_ANSWER_BYTES = 1 << 20
"""An answer's images' size at most (the frontend takes messages of up to 4 MiB)."""
MAX_REFERENCES = 16
"""Public references of one image in the answer at most."""
MAX_INSTANCES = 16
"""Instances named for one image at most (workers_holding counts them all)."""


def held_images(reports: Mapping[str, Mapping[str, tuple[str, ...]]]) -> tuple[list[pb.HeldImage], bool]:
    """`reports` (instance -> digest -> public references) merged by digest, the most widely held first (then by
    digest), within the bounds; and whether some were left out."""
    holders: dict[str, list[str]] = {}
    references: dict[str, dict[str, None]] = {}
    for instance, images in sorted(reports.items()):
        for digest, public in images.items():
            holders.setdefault(digest, []).append(instance)
            references.setdefault(digest, {}).update(dict.fromkeys(public))
    order = sorted(holders, key=lambda digest: (-len(holders[digest]), digest))
    answer: list[pb.HeldImage] = []
    size = 0
    for digest in order[:MAX_HELD_IMAGES]:
        image = pb.HeldImage(digest=digest, workers_holding=len(holders[digest]),
                             public_references=sorted(references[digest])[:MAX_REFERENCES],
                             instances=holders[digest][:MAX_INSTANCES])
        size += image.ByteSize() + 4  # the entry's tag and length
        if size > MAX_ANSWER_BYTES:
            break
        answer.append(image)
    return answer, len(answer) < len(order)
