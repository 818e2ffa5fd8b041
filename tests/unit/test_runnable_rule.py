"""Whether a Ready job may run is one rule, written out where it is used and held to one text here.

A job may run if it always runs, or if no parent failed it (dependency_failed) and its group is not
cancelled, itself or through an ancestor. "Its group is cancelled" has one source, the view
job_groups_cancelled_self_or_ancestor (migration 0024), which every procedure asks. The rule around it is
written out in each procedure rather than wrapped in a stored function, because MariaDB evaluates a
function per row and cannot use an index through it. Measured with EXPLAIN and timings on 35,000 Ready
jobs (MariaDB 10.11; one batch of 30,000 in 10 groups, one cancelled; one cancelled batch of 5,000),
the rule as a function `job_may_run(batch_id, job_group_id, always_run, dependency_failed)`:

- read_ready_heads' walk of jobs_ready_queue keeps its index (ref on state, pool, user) but calls the
  function for every job it passes: a head of 300 behind a cancelled group 0.9 -> 8.0 ms, a walk past
  5,000 jobs of a cancelled batch 2.0 -> 104 ms;
- cancel_ready_jobs loses the always_run part of its jobs_scheduling range (key_len 10 -> 9):
  1,000 jobs 5.1 -> 213 ms;
- cancel_pending_jobs loses the group part of its jobs_group_state lookup (key_len 13 -> 8), 10x slower;
- per row of a scratch table (schedule_jobs' candidates): 500 rows 2.3 -> 13.8 ms.

The view, merged into each statement, gives the same plans (same keys, key lengths and materialized
semi-joins) and the same times as the join written out (tests/db/test_runnable_rule.py checks that it
stays merged). So every copy of the rule must read, with {j} the job's alias, either

    may run:        ({j}.always_run OR (NOT {j}.dependency_failed AND NOT <cancelled>))
    must not run:   NOT {j}.always_run AND ({j}.dependency_failed OR <cancelled>)

where <cancelled> is the view's EXISTS for the job's group, the view's IN for a batch's groups, or what a
procedure gathered from the view (read_ready_heads' tmp_cancelled_groups row, schedule_jobs'
group_cancelled column); read_ready_heads' walk for when no group of a running batch is cancelled drops
that part: ({j}.always_run OR NOT {j}.dependency_failed).
"""

from __future__ import annotations

import re
from collections import Counter

import pytest

from services.db import plan_snapshot
from services.db.migrations import SQL_DIR

VIEW = "job_groups_cancelled_self_or_ancestor"
ROUTINES = sorted((SQL_DIR / "procedures").glob("*.sql")) + sorted((SQL_DIR / "triggers").glob("*.sql"))


def _folded(text: str) -> str:
    """`text` without `--` comments, whitespace folded to one space, no space inside parentheses."""
    code = "\n".join(line.split("--", 1)[0] for line in text.splitlines())
    return re.sub(r"\(\s+", "(", re.sub(r"\s+\)", ")", " ".join(code.split())))


def _cancelled_forms(j: str) -> tuple[list[str], list[str]]:
    """The ways a copy may say that job `j`'s group is cancelled, and that it is not."""
    exists = f"EXISTS (SELECT 1 FROM {VIEW} x WHERE x.batch_id = {j}.batch_id AND x.job_group_id = {j}.job_group_id)"
    batch_in = f"{j}.job_group_id IN (SELECT x.job_group_id FROM {VIEW} x WHERE x.batch_id = in_batch_id)"
    cancelled = [exists, batch_in, "g.batch_id IS NOT NULL", f"{j}.group_cancelled"]
    not_cancelled = [f"NOT {exists}", f"NOT {batch_in}", "g.batch_id IS NULL", f"NOT {j}.group_cancelled"]
    return cancelled, not_cancelled


def _copies(code: str) -> list[tuple[str, str, int]]:
    """Every place `code` writes the rule (or starts to): (kind, alias, offset)."""
    found = [("may run", m.group(1), m.start()) for m in re.finditer(r"\((\w+)\.always_run OR ", code)]
    found += [("must not run", m.group(1), m.start()) for m in re.finditer(r"NOT (\w+)\.always_run AND \(", code)]
    return found


def _canonical(kind: str, j: str) -> list[str]:
    cancelled, not_cancelled = _cancelled_forms(j)
    if kind == "may run":
        return [f"({j}.always_run OR (NOT {j}.dependency_failed AND {c}))" for c in not_cancelled] + [
            f"({j}.always_run OR NOT {j}.dependency_failed)"]
    return [f"NOT {j}.always_run AND ({j}.dependency_failed OR {c})" for c in cancelled]


SOURCES = {path.stem: _folded(path.read_text()) for path in ROUTINES}
SOURCES["plan_snapshot.MAY_RUN"] = _folded(plan_snapshot.MAY_RUN)

EXPECTED = {
    "read_ready_heads": Counter({"may run": 3}),
    "schedule_jobs": Counter({"must not run": 1}),
    "cancel_ready_jobs": Counter({"must not run": 1}),
    "plan_snapshot.MAY_RUN": Counter({"may run": 1}),
}
"""Where the rule is written, and how often: a copy added elsewhere is held to the text too, and this
list says where to look when the rule changes."""


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_every_copy_of_the_rule_reads_the_same(name: str) -> None:
    code = SOURCES[name]
    for kind, j, at in _copies(code):
        assert any(code.startswith(text, at) for text in _canonical(kind, j)), (
            f"{name}: the '{kind}' rule is written otherwise than the others: {code[at:at + 200]!r}")


def test_the_copies_are_where_they_are_listed() -> None:
    found = {name: Counter(kind for kind, _, _ in _copies(code)) for name, code in SOURCES.items()}
    assert {name: n for name, n in found.items() if n} == EXPECTED


def test_the_cancelled_test_has_one_source() -> None:
    """No procedure joins the cancellations to the groups' ancestors itself; the view does, and what
    read_ready_heads and schedule_jobs gather for the rule comes from it."""
    for name, code in SOURCES.items():
        assert not re.search(r"job_group_self_and_ancestors \w+ JOIN job_groups_cancelled|"
                             r"job_groups_cancelled \w+ JOIN job_group_self_and_ancestors", code), name
    assert f"INSERT IGNORE INTO tmp_cancelled_groups (batch_id, job_group_id) SELECT x.batch_id, x.job_group_id " \
           f"FROM {VIEW} x " in SOURCES["read_ready_heads"]
    assert f"SET t.group_cancelled = EXISTS (SELECT 1 FROM {VIEW} x WHERE x.batch_id = t.batch_id " \
           f"AND x.job_group_id = t.job_group_id)" in SOURCES["schedule_jobs"]
    users = {name for name, code in SOURCES.items() if VIEW in code}
    assert users == {"cancel_pending_jobs", "cancel_ready_jobs", "insert_job_groups", "insert_jobs",
                     "mark_jobs_started", "read_ready_heads", "rerun_failed_jobs", "schedule_jobs",
                     "plan_snapshot.MAY_RUN"}


def test_a_copy_written_otherwise_is_caught() -> None:
    """The check is not vacuous: the rule with its two tests swapped, or the join written out, fails."""
    swapped = _folded("WHERE NOT j.always_run AND (j.group_cancelled OR j.dependency_failed)")
    [(kind, j, at)] = _copies(swapped)
    assert not any(swapped.startswith(text, at) for text in _canonical(kind, j))
    written_out = _folded("(j.always_run OR (NOT j.dependency_failed AND NOT EXISTS (SELECT 1 FROM "
                          "job_group_self_and_ancestors a JOIN job_groups_cancelled c ON c.batch_id = a.batch_id "
                          "AND c.job_group_id = a.ancestor_id WHERE a.batch_id = j.batch_id "
                          "AND a.job_group_id = j.job_group_id)))")
    [(kind, j, at)] = _copies(written_out)
    assert not any(written_out.startswith(text, at) for text in _canonical(kind, j))
