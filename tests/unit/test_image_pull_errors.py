"""How skopeo's last words become an ImagePullError's reason and kind (services.worker.image_tools).
The real messages are produced by the real tools in tests/service/test_image_cache.py; these are the
edges that a real registry does not produce on demand."""

from __future__ import annotations

import pytest

from services.worker.image_tools import ImagePullError, PullFailure, classify, reason


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
    # The worker's egress proxy refused where the registry sent the pull (services.worker.egress).
    ('pinging container registry r: Get "https://r/v2/": corral refuses this destination', PullFailure.REFUSED),
    ('reading manifest 1 in r/b: Get "https://auth.r/token": corral refuses this destination', PullFailure.REFUSED),
    ('reading manifest 1 in r/b: Get "https://r/v2/b/manifests/1": destination unreachable', PullFailure.UNREACHABLE),
    ('reading manifest 1 in r/b: Get "https://r/v2/b/manifests/1": egress proxy busy', PullFailure.UNREACHABLE),
])
def test_failures_are_told_apart_by_the_registrys_words(detail: str, failure: PullFailure) -> None:
    assert classify(detail) is failure


def test_the_user_is_told_corrals_words_and_the_operator_the_registrys() -> None:
    """Issue 33 part 6: a pull failure reaches the job's user without the registry's address or the network's
    answer; the exception's own text (for the worker's log) keeps them."""
    refused = ImagePullError("127.0.0.1:9/b:latest", PullFailure.UNREACHABLE,
                             'Get "http://127.0.0.1:9/v2/": dial tcp 127.0.0.1:9: connect: connection refused')
    assert refused.user_words == "registry unreachable"
    assert "connection refused" in str(refused) and "127.0.0.1:9" in str(refused)
    assert ImagePullError("r/b", PullFailure.UNAUTHORIZED, "unauthorized: authentication required").user_words == \
        "not authorised"
    assert ImagePullError("r/b", PullFailure.NOT_FOUND, "manifest unknown").user_words == "no such image"
    assert ImagePullError("r/b", PullFailure.REFUSED, "x", user_words="registry r is a loopback address").user_words \
        == "registry r is a loopback address"
