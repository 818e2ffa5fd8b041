-- Internal, last step of releasing children: the children's changes go to
-- tmp_job_changes (after whatever the caller put there first: a parent's
-- event comes before its children's) for record_job_changes, and the queue
-- follows the ranges: a parent whose children ran out within its range
-- leaves job_child_releases, one with more gets (or keeps) its row with
-- next_child_id where its range ended, at the back of the queue.
DROP PROCEDURE IF EXISTS release_children_record;
DELIMITER $$
CREATE PROCEDURE release_children_record(IN in_now_ms BIGINT)
BEGIN
  -- Only Pending children change in a way the counters or events see: a
  -- final child's dependency_failed counts nowhere.
  INSERT INTO tmp_job_changes (batch_id, job_id, job_group_id, inst_coll, cores_mcpu, always_run,
                               old_state, new_state, old_dependency_failed, new_dependency_failed, attempt_id)
    SELECT batch_id, job_id, job_group_id, inst_coll, cores_mcpu, always_run,
           old_state, IF(becomes_ready, 'Ready', old_state),
           old_dependency_failed, (old_dependency_failed OR n_unaccepted > 0), attempt_id
    FROM tmp_children
    WHERE old_state = 'Pending' AND (becomes_ready OR (n_unaccepted > 0 AND NOT old_dependency_failed))
    ORDER BY batch_id, job_id;

  INSERT INTO job_child_releases (batch_id, parent_id, parent_state, next_child_id, time_queued_ms, last_step_ms)
    SELECT batch_id, parent_id, parent_state, to_child_id, in_now_ms, in_now_ms
    FROM tmp_releases
    WHERE to_child_id IS NOT NULL
    ORDER BY batch_id, parent_id
  ON DUPLICATE KEY UPDATE
    next_child_id = VALUES(next_child_id),
    last_step_ms = VALUES(last_step_ms);
  DELETE q FROM job_child_releases q
    JOIN tmp_releases r ON r.batch_id = q.batch_id AND r.parent_id = q.parent_id
    WHERE r.to_child_id IS NULL;
END $$
DELIMITER ;
