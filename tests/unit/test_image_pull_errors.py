"""How skopeo's last words become an ImagePullError's reason and kind (services.worker.image_tools).
The real messages are produced by the real tools in tests/service/test_image_cache.py; these are the
edges that a real registry does not produce on demand."""

from __future__ import annotations

import pytest

from services.worker.image_tools import PullFailure, classify, reason


def test_the_reason_is_skopeos_fatal_message_without_the_image_name_it_repeats() -> None:
    stderr = ('time="2026-11-27T06:34:51Z" level=fatal msg="Error parsing image name \\"docker://r:5/b:nope\\": '
              'reading manifest nope in r:5/b: manifest unknown: manifest unknown"\n')
    assert reason(stderr) == "reading manifest nope in r:5/b: manifest unknown: manifest unknown"
    assert reason("no structured line\nlast line here\n\n") == "last line here"
    assert reason("") == "(no message)"
    assert len(reason("x" * 5000)) == 1000


@pytest.mark.parametrize(("detail", "failure"), [
    ("reading manifest latest in r/b: unauthorized: authentication required", PullFailure.UNAUTHORIZED),
    ("requested access to the resource is denied", PullFailure.UNAUTHORIZED),
    ('pinging container registry r:5: Get "http://r:5/v2/": dial tcp r:5: connect: connection refused',
     PullFailure.UNREACHABLE),
    ("pinging container registry r: Get \"https://r/v2/\": http: server gave HTTP response to HTTPS client",
     PullFailure.UNREACHABLE),
    ("lookup nowhere.invalid: no such host", PullFailure.UNREACHABLE),
    ("reading manifest sha256:401abc in r/b: manifest unknown: manifest unknown", PullFailure.NOT_FOUND),
    ("writing blob: open /cache/tmp/x: permission denied", PullFailure.FAILED),
    ("writing blob: no space left on device", PullFailure.FAILED),
])
def test_failures_are_told_apart_by_the_registrys_words(detail: str, failure: PullFailure) -> None:
    assert classify(detail) is failure
