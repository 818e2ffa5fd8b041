"""The pipeline's tests run LocalBackend's jobs as processes ($CORRAL_PIPELINE_CONTAINERS=0): a container
costs some 100 ms of cpu to start, and hailtop.batch's ported tests run hundreds of jobs. The tests of the
container path (test_local_containers.py) ask for containers with `LocalBackend(containers=True)`."""

from __future__ import annotations

import pytest

from corral.pipeline.backend.local import CONTAINERS_VARIABLE


@pytest.fixture(autouse=True)
def jobs_as_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CONTAINERS_VARIABLE, "0")
