-- Internal, second step of releasing children (after release_children_lock,
-- and in complete_jobs_core after the targets' own update): one fewer
-- pending parent per released edge; remember a parent state the edge does
-- not accept; Ready when nothing is pending and the child's update is
-- committed (jobs of an uncommitted update stay invisible; commit_update
-- readies them). The update's row is read (share-locked) only for a child
-- about to become Ready: a commit_update in flight holds it, and the child
-- must wait to see it committed rather than stay Pending for good.
--
-- A child is Pending or final here: Ready needs no pending parent, and a
-- Pending job of a cancelled group may have been cancelled (cancel_pending_jobs)
-- before its parents ended. A final child keeps its state; its counts are
-- still kept, so that they stay what its parents' states say.
--
-- The caller set no bulk flag; this sets @corral_bulk_job_changes around its
-- update of jobs (the changes are recorded by release_children_record) and
-- the caller's error handler clears it.
DROP PROCEDURE IF EXISTS release_children_apply;
DELIMITER $$
CREATE PROCEDURE release_children_apply()
BEGIN
  UPDATE tmp_children c
    JOIN jobs j ON j.batch_id = c.batch_id AND j.job_id = c.job_id
    SET c.job_group_id = j.job_group_id, c.inst_coll = j.inst_coll, c.cores_mcpu = j.cores_mcpu,
        c.always_run = j.always_run, c.attempt_id = j.attempt_id, c.old_state = j.state,
        c.old_dependency_failed = j.dependency_failed, c.n_pending_parents = j.n_pending_parents,
        c.becomes_ready = (j.state = 'Pending' AND j.n_pending_parents = c.n_done
                           AND EXISTS (SELECT 1 FROM batch_updates u
                                       WHERE u.batch_id = j.batch_id AND u.update_id = j.update_id
                                         AND u.committed));
  -- A count below its decrement is corrupt data, refused here rather than
  -- by the CHECK: MariaDB 10.11 runs no handler for a CHECK that fails in
  -- a multi-table UPDATE, so the transaction would stay open (for the next
  -- START TRANSACTION to commit half done) and @corral_bulk_job_changes set.
  IF EXISTS (SELECT 1 FROM tmp_children WHERE n_pending_parents < n_done) THEN
    SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'corrupt jobs.n_pending_parents: fewer than the parents completing';
  END IF;
  SET @corral_bulk_job_changes = TRUE;
  UPDATE jobs j
    JOIN tmp_children c ON c.batch_id = j.batch_id AND j.job_id = c.job_id
    SET j.n_pending_parents = j.n_pending_parents - c.n_done,
        j.dependency_failed = (j.dependency_failed OR c.n_unaccepted > 0),
        j.state = IF(c.becomes_ready, 'Ready', j.state);
  SET @corral_bulk_job_changes = NULL;
END $$
DELIMITER ;
