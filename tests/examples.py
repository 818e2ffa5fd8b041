"""How many examples the costliest property tests try: a fifth in the default suite, all of them when the
run asks for the slow tests (`scripts/test.sh -m slow ...`; tests/tiers.py says so before modules load).

The planner's properties tried 400 to 2,000 plans each, about 150 s of the suite's CPU on the 2-core
machine; a fifth of each keeps every property in every run and the full search on request."""

from __future__ import annotations

import os

THOROUGH_VARIABLE = "CORRAL_THOROUGH_PROPERTIES"
SHORT_SHARE = 5


def examples(full: int) -> int:
    """`full` when the run is thorough, else a fifth of it (at least 50)."""
    if os.environ.get(THOROUGH_VARIABLE) == "1":
        return full
    return max(full // SHORT_SHARE, min(full, 50))
