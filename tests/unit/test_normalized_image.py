"""The job's image as `GetJob` and `corral job` give it (issue 35): `Job.normalized_image` is the spec's
image as every container tool reads it (services.common.image_refs with Docker Hub for bare names), and
`corral job` shows it with the spec's words where they differ."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.batch.v1 import job_pb2, job_spec_pb2
from corral.cli_jobs import image_words
from services.frontend.job_protos import normalized_image

# Without dots: a bare name's first component with one would name a registry.
component = st.from_regex(r"[a-z0-9]{1,8}(?:(?:_|__|-{1,2})[a-z0-9]{1,8}){0,2}", fullmatch=True)
references = st.builds(
    lambda registry, path, tag, digest: registry + "/".join(path) + (f":{tag}" if tag else "")
    + (f"@{digest}" if digest else ""),
    st.sampled_from(["", "docker.io/", "index.docker.io/", "localhost/", "127.0.0.1:5000/", "ghcr.io/"]),
    st.lists(component, min_size=1, max_size=3), st.none() | st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,10}",
                                                                            fullmatch=True),
    st.none() | st.from_regex(r"sha256:[0-9a-f]{64}", fullmatch=True))


@pytest.mark.parametrize(("written", "normalized"), [
    ("busybox", "docker.io/library/busybox:latest"),
    ("ubuntu:24.04", "docker.io/library/ubuntu:24.04"),
    ("lab/tool", "docker.io/lab/tool:latest"),
    ("index.docker.io/library/busybox:1.36", "docker.io/library/busybox:1.36"),
    ("localhost/proj/tool:2", "localhost/proj/tool:2"),
    ("ghcr.io/org/tool@sha256:" + "a" * 64, "ghcr.io/org/tool@sha256:" + "a" * 64),
    ("", ""),
    ("Busybox", ""),  # not a reference (refused at submission since issue 35): nothing to normalize
])
def test_normalized_image(written: str, normalized: str) -> None:
    assert normalized_image(written) == normalized


@given(references)
def test_a_normalized_image_normalizes_to_itself(written: str) -> None:
    once = normalized_image(written)
    assert once and normalized_image(once) == once


@given(st.text(max_size=40))
def test_any_text_normalizes_or_is_left_empty(text: str) -> None:
    once = normalized_image(text)
    assert once == "" or normalized_image(once) == once


def job(image: str) -> job_pb2.Job:
    return job_pb2.Job(spec=job_spec_pb2.JobSpec(image=image), normalized_image=normalized_image(image))


def test_corral_job_shows_what_was_written_only_where_it_differs() -> None:
    assert image_words(job("busybox")) == "docker.io/library/busybox:latest (written busybox)"
    assert image_words(job("docker.io/library/busybox:latest")) == "docker.io/library/busybox:latest"
    assert image_words(job("Busybox")) == "Busybox"  # as it was written, when it is not a reference
    assert image_words(job_pb2.Job(spec=job_spec_pb2.JobSpec(image="busybox"))) == "busybox"  # an older frontend
    assert image_words(job("")) == "(none)"
