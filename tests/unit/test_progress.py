"""The progress a waiting client shows (corral/progress.py): counts from a Batch read, moved by the events
that follow it, exact at completion."""

from __future__ import annotations

import io

from corral.batch.v1 import batch_event_pb2, batch_pb2, job_state_pb2
from corral.progress import BatchProgress, ProgressLine

S = job_state_pb2


def read(n_jobs: int, **counts: int) -> BatchProgress:
    return BatchProgress.from_batch(batch_pb2.Batch(batch_id=7, counts=batch_pb2.JobCounts(n_jobs=n_jobs, **counts),
                                                    state=batch_pb2.BATCH_STATE_RUNNING))


def committed(start_job_id: int, n_jobs: int) -> batch_event_pb2.BatchEvent:
    return batch_event_pb2.BatchEvent(update_committed=batch_event_pb2.UpdateCommitted(
        update_id=1, start_job_id=start_job_id, n_jobs=n_jobs))


def changed(old: int, new: int) -> batch_event_pb2.BatchEvent:
    return batch_event_pb2.BatchEvent(job_state_changed=batch_event_pb2.JobStateChanged(
        job_id=1, old_state=old, new_state=new))


def test_an_update_the_read_already_counted_is_not_counted_again() -> None:
    """Right after a submission the read counts the update's jobs while its event is still to be published:
    a 5-job batch showed 10 jobs."""
    progress = read(5, n_ready=5)
    progress.apply(committed(1, 5))
    assert progress.n_jobs == 5
    assert progress.line().endswith("0/5 done: 0 succeeded, 0 failed, 0 errored, 0 cancelled; 0 running, 5 waiting")


def test_an_update_after_the_read_adds_its_jobs() -> None:
    progress = read(5, n_succeeded=5)
    progress.apply(committed(6, 3))
    assert (progress.n_jobs, progress.n_done, progress.complete) == (8, 5, False)


def test_changes_move_jobs_between_buckets_and_completion_is_exact() -> None:
    progress = read(3, n_ready=3)
    progress.apply(changed(S.JOB_STATE_READY, S.JOB_STATE_RUNNING))
    progress.apply(changed(S.JOB_STATE_RUNNING, S.JOB_STATE_SUCCEEDED))
    progress.apply(changed(S.JOB_STATE_READY, S.JOB_STATE_CANCELLED))
    assert (progress.n_ready, progress.n_running, progress.n_succeeded, progress.n_cancelled) == (1, 0, 1, 1)
    progress.apply(batch_event_pb2.BatchEvent(batch_completed=batch_event_pb2.BatchCompleted(
        counts=batch_pb2.JobCounts(n_jobs=3, n_succeeded=2, n_cancelled=1))))
    assert progress.complete and (progress.n_done, progress.n_running, progress.n_ready) == (3, 0, 0)
    assert progress.line().endswith("3/3 done: 2 succeeded, 0 failed, 0 errored, 1 cancelled; 0 running, "
                                    "0 waiting - complete")


def test_a_count_never_goes_below_zero_and_done_never_above_the_jobs() -> None:
    """A change the read already showed comes again as an event: the counts are approximate until completion,
    never negative, and the line never says more done than there are jobs."""
    progress = read(1, n_succeeded=1)
    progress.apply(changed(S.JOB_STATE_RUNNING, S.JOB_STATE_SUCCEEDED))
    assert progress.n_running == 0 and "1/1 done" in progress.line()


def test_off_a_terminal_a_line_at_most_every_interval_and_always_the_last() -> None:
    stream, now = io.StringIO(), [0.0]
    line = ProgressLine(stream, min_interval_s=5.0, clock_s=lambda: now[0])
    progress = read(2, n_ready=2)
    line.show(progress)
    progress.apply(changed(S.JOB_STATE_READY, S.JOB_STATE_RUNNING))
    now[0] = 1.0
    line.show(progress)  # too soon: not written
    progress.apply(batch_event_pb2.BatchEvent(batch_completed=batch_event_pb2.BatchCompleted(
        counts=batch_pb2.JobCounts(n_jobs=2, n_succeeded=2))))
    now[0] = 2.0
    line.show(progress)  # completion: always written
    written = stream.getvalue().splitlines()
    assert len(written) == 2 and written[0].endswith("0/2 done: 0 succeeded, 0 failed, 0 errored, 0 cancelled; "
                                                     "0 running, 2 waiting")
    assert written[1].endswith("- complete")
