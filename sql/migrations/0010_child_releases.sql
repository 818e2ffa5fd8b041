-- Large fan-out (issue 9): a parent's children are released in bounded
-- chunks, not in the transaction that completes the parent.
--
-- complete_jobs_core (MJC, the cancellers) records a parent's final state
-- and releases at most a few of its children itself (decrements their
-- n_pending_parents, readies those left with none, flags dependency_failed);
-- for a parent with more, it queues one row here, and the driver's releaser
-- loop (release_children) goes on from next_child_id, a few thousand
-- children per transaction, until the row is deleted. Children are taken in
-- job id order: every child with job_id >= next_child_id is still to be
-- released for this parent, every child below it has been. So an edge
-- (child, parent) counts in the child's n_pending_parents while the parent
-- is not final, or while this row exists with next_child_id <= child's id;
-- check_invariants recomputes exactly that.
--
-- parent_state is the parent's final state, which decides whether each edge
-- accepts it (dependency_failed). last_step_ms orders the queue: a row that
-- was just served goes to the back, so one parent with a million children
-- does not hold up another's ten.
--
-- No foreign keys, as for the counter tables: a check would share-lock the
-- parent job, which MJC holds exclusively, and rows go with their batch
-- when the cleanup procedure removes it.
CREATE TABLE job_child_releases (
  batch_id BIGINT NOT NULL,
  parent_id INT NOT NULL,
  parent_state ENUM('Success', 'Failed', 'Error', 'Cancelled') NOT NULL,
  next_child_id INT NOT NULL,
  time_queued_ms BIGINT NOT NULL,
  last_step_ms BIGINT NOT NULL,
  PRIMARY KEY (batch_id, parent_id),
  INDEX job_child_releases_turn (last_step_ms, batch_id, parent_id)
) ENGINE=InnoDB;
