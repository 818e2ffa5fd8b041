"""Drawing examples of a hypothesis strategy outside a @given test.

Tests over real gRPC are async and use function-scoped fixtures, which
@given cannot wrap; they draw their inputs first with `draw_examples` and
then send each one, naming the input in every assertion. Hypothesis still
generates (and mixes families, sizes and edge cases as it does for @given);
it only does not shrink a failure, which is why the input is printed whole.
"""

from __future__ import annotations

from typing import TypeVar

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

T = TypeVar("T")


def draw_examples(strategy: st.SearchStrategy[T], n: int) -> list[T]:
    """`n` examples of `strategy` (fewer only if it has fewer distinct ones)."""
    found: list[T] = []

    @settings(max_examples=n, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(example: T) -> None:
        found.append(example)

    collect()
    return found
