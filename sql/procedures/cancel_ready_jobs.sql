-- The canceller's set-based drain: up to in_limit jobs of one batch that are
-- Ready and must not run, because
-- their group or an ancestor is cancelled or a parent ended in a state they
-- do not accept, become Cancelled in one transaction; always_run jobs are
-- never taken. Up to in_max_children of their children are released in the
-- same pass, the rest by the driver's releaser (complete_jobs_core). A
-- child left Ready with dependency_failed is taken by a later call, so a
-- chain of failed dependencies drains one level per call; Pending jobs of
-- cancelled groups are taken directly by cancel_pending_jobs.
-- Returns the status row with n_cancelled.
DROP PROCEDURE IF EXISTS cancel_ready_jobs;
DELIMITER $$
CREATE PROCEDURE cancel_ready_jobs(IN in_epoch BIGINT, IN in_batch_id BIGINT, IN in_limit INT, IN in_now_ms BIGINT,
                                   IN in_max_children INT)
proc: BEGIN
  DECLARE v_ok BOOLEAN;
  DECLARE v_n INT;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN
    -- complete_jobs_core sets these around its bulk statements; a pooled
    -- connection must not carry them into its next call.
    SET @corral_bulk_job_changes = NULL, @corral_bulk_usage = NULL;
    ROLLBACK;
    RESIGNAL;
  END;

  IF in_limit IS NULL OR in_limit < 0 OR in_max_children IS NULL OR in_max_children < 0 THEN
    SELECT 3 AS rc, 'limit and max_children must not be negative' AS message;
    LEAVE proc;
  END IF;
  CALL create_completion_tables();
  START TRANSACTION;
  CALL check_epoch(in_epoch, v_ok);
  IF NOT v_ok THEN
    ROLLBACK;
    SELECT 4 AS rc, 'stale leader epoch' AS message;
    LEAVE proc;
  END IF;
  -- The scheduling index keeps a batch's Ready, not always_run jobs together,
  -- so each call reads about in_limit rows however much of the batch is
  -- already drained. The optimizer prefers the primary key (batch_id, job_id)
  -- and ORDER BY job_id would keep it there, skipping every job already
  -- cancelled: the drain of a million jobs slowed down as it went. Which jobs
  -- come first does not matter: complete_jobs_core locks them in key order.
  INSERT INTO tmp_job_completions (batch_id, job_id, new_state, reason)
    SELECT j.batch_id, j.job_id, 'Cancelled', 'cancelled'
    FROM jobs j FORCE INDEX (jobs_scheduling)
    WHERE j.batch_id = in_batch_id AND j.state = 'Ready' AND NOT j.always_run
      AND (j.dependency_failed
           OR j.job_group_id IN (SELECT x.job_group_id FROM job_groups_cancelled_self_or_ancestor x
                                 WHERE x.batch_id = in_batch_id))
    LIMIT in_limit;
  -- A job a parent failed says which parent, how it ended and what the job
  -- accepts (GetJob's error_message, ExplainJob); a job of a cancelled group
  -- keeps the group's reason.
  UPDATE jobs j
    JOIN tmp_job_completions t ON t.batch_id = j.batch_id AND t.job_id = j.job_id
    SET j.end_reason = (
      SELECT CONCAT('parent job ', p.job_id, ' ended ', LOWER(p.state), ' and this job runs only after ',
                    CONCAT_WS(' or ', IF(e.accepted_states & 1, 'success', NULL), IF(e.accepted_states & 2, 'failed', NULL),
                              IF(e.accepted_states & 4, 'error', NULL), IF(e.accepted_states & 8, 'cancelled', NULL)))
      FROM job_parents e
      JOIN jobs p ON p.batch_id = e.batch_id AND p.job_id = e.parent_id
      WHERE e.batch_id = j.batch_id AND e.job_id = j.job_id
        AND p.state IN ('Success', 'Failed', 'Error', 'Cancelled')
        AND (e.accepted_states & CASE p.state WHEN 'Success' THEN 1 WHEN 'Failed' THEN 2
                                              WHEN 'Error' THEN 4 ELSE 8 END) = 0
      ORDER BY e.parent_id
      LIMIT 1)
    WHERE j.dependency_failed AND j.end_reason IS NULL;
  CALL complete_jobs_core(in_now_ms, in_max_children);
  SELECT COUNT(*) INTO v_n FROM tmp_job_completions WHERE outcome = 'completed';
  COMMIT;
  CALL check_completions(in_now_ms);
  SELECT 0 AS rc, 'ok' AS message, v_n AS n_cancelled;
END $$
DELIMITER ;
