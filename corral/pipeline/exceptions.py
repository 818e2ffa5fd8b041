"""The pipeline library's own error: a batch described wrongly (hailtop.batch's `BatchException`)."""

from __future__ import annotations


class BatchException(Exception):
    """A batch, job or resource used in a way the library cannot run: raised while the batch is described,
    before anything runs or is submitted."""
